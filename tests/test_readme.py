"""Every shell block of the README, the app READMEs and the guides runs verbatim.

The default is that a block runs: each ``sh`` block of the documents in :data:`DOCS` is run
with ``bash`` in a working directory of its own document, against a throwaway overlay: the
README's routers (its block marked ``<!-- runnable: daemons -->``), started first. It must
exit 0 without a traceback, and print the text of an ``expect="..."`` in its marker. The
commands run as written, except that every loopback port (``127.0.0.1:NNNN``) is moved to a
free one, the same one wherever it appears, so the documents may refer to the README's
routers (``127.0.0.1:7001`` is r1 everywhere).

A block that cannot run here says so right above it, with a reason from :data:`REASONS`
and why in parentheses: ``<!-- not run: long (...) -->``. Python blocks run only when marked
``<!-- runnable ... -->`` (the others sketch an API). The deployment guide's root steps
(``<!-- runnable: root ... -->``) are run by tests/test_docs_deploy.py in a sandbox.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .checkout import ROOT
from .consolescripts import install_shims, script_env
from .logready import LoggedProcess
from .ports import free_port, free_port_block

#: the documents whose blocks run (README, the apps' and services' READMEs, the guides)
DOCS = ["README.md", "apps/flowchat/README.md", "apps/flowvideo/README.md",
        "directory/README.md", "topologies/README.md", "topologies/deploy/README.md",
        "docs/operations.md", "docs/architecture.md"]
#: why a block may be left out; anything else runs
REASONS = {
    "root": "needs root or network namespaces",
    "long": "runs for minutes",
    "external": "needs something outside this machine (a cloud store, a deployed host)",
    "interactive": "a terminal UI waiting for a person",
    "ci": "is CI itself (the checks of .ci/run), or installs into the running Python",
}
BLOCK = re.compile(r"(?:<!-- (?P<marker>[^>]*?) -->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)```",
                   re.S)
NOT_RUN = re.compile(r"not run: (?P<reason>[a-z]+) \((?P<why>[^)]+)\)", re.S)
EXPECT = re.compile(r'expect="(?P<text>[^"]*)"')


class Block:
    def __init__(self, doc: str, line: int, marker: str, lang: str, body: str) -> None:
        self.doc, self.line, self.marker, self.lang, self.body = doc, line, marker, lang, body

    @property
    def daemons(self) -> bool:
        return self.marker.startswith("runnable: daemons")

    @property
    def runs(self) -> bool:
        if self.lang == "python":
            return self.marker.startswith("runnable") and not self.daemons
        return self.lang == "sh" and not self.daemons and not self.marker.startswith(
            ("not run:", "runnable: root"))

    @property
    def expect(self) -> str:
        m = EXPECT.search(self.marker)
        return m.group("text") if m else ""

    def __repr__(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(doc: str) -> list[Block]:
    text = (ROOT / doc).read_text()
    return [Block(doc, text[:m.start()].count("\n") + 1, " ".join((m.group("marker") or "")
                                                                   .split()),
                  m.group("lang"), m.group("body")) for m in BLOCK.finditer(text)]


def test_every_shell_block_runs_or_says_why_not() -> None:
    running = 0
    for doc in DOCS:
        for b in blocks(doc):
            if b.lang != "sh":
                continue
            if b.marker.startswith("not run:"):
                m = NOT_RUN.fullmatch(b.marker)
                assert m and m.group("reason") in REASONS, (
                    f"{b}: write <!-- not run: REASON (why) -->, REASON one of {sorted(REASONS)}")
            running += b.runs
    assert running >= 15


def test_no_document_cites_files_outside_the_repository() -> None:
    for path in [*ROOT.glob("*.md"), *ROOT.glob("docs/**/*"), *ROOT.glob("apps/*/README.md"),
                 *ROOT.glob("directory/*.md"), *ROOT.glob("topologies/**/*.md")]:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "DESIGN.md" not in text and "/work/shared" not in text, path


# ---------------------------------------------------------------- running them
class Ports:
    """Every README port moved to a free one, consistently across documents."""

    def __init__(self) -> None:
        self.moved: dict[str, str] = {}

    def port(self, old: str) -> str:
        return self.moved.setdefault(old, str(free_port()))

    def block(self, old: str) -> str:
        """A run of free ports (``--base-port``: a topology's routers count up from it)."""
        return self.moved.setdefault(f"base {old}", str(free_port_block(40)))

    def __call__(self, text: str) -> str:
        text = re.sub(r"--base-port (\d{4})\b",
                      lambda m: "--base-port " + self.block(m.group(1)), text)
        text = re.sub(r'"127\.0\.0\.1", (\d{4})\b',
                      lambda m: '"127.0.0.1", ' + self.port(m.group(1)), text)
        return re.sub(r"127\.0\.0\.1:(\d{4})\b",
                      lambda m: "127.0.0.1:" + self.port(m.group(1)), text)


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[dict[str, str], Ports]]:
    """The README's routers, running, and the environment the blocks run in."""
    tmp = tmp_path_factory.mktemp("overlay")
    env = script_env(install_shims(tmp / "bin"), FLOWNET_STATE_DIR=str(tmp / "state"))
    ports = Ports()
    (daemons,) = [b for b in blocks("README.md") if b.daemons]
    procs: list[LoggedProcess] = []
    try:
        for line in daemons.body.replace("\\\n", " ").splitlines():
            if line.strip():
                # HTTP monitoring where the README says it is: listen port + 1000 (8001 for
                # r1), then moved with the other ports
                listen = re.search(r"--listen 127\.0\.0\.1:(\d{4})", line)
                assert listen, line
                line += f" --http 127.0.0.1:{int(listen.group(1)) + 1000}"
                argv = shlex.split(ports(line))
                assert argv[0] == "flowrouter", line
                # -v: the router logs the line that says it is up (tests/logready.py)
                procs.append(LoggedProcess([argv[0], "-v", *argv[1:]], env, tmp,
                                           tmp / f"r{len(procs)}.log"))
        for r in procs:  # every router is up: listeners, control port, HTTP
            if not r.wait_ready():
                logs = "\n".join(p.text()[-600:] for p in procs)
                pytest.fail(f"a README router did not start: {r.proc.args}\n{logs}")
        yield env, ports
    finally:
        for r in procs:
            r.proc.send_signal(signal.SIGINT)
        for r in procs:
            try:
                r.proc.wait(30)
            except subprocess.TimeoutExpired:
                r.proc.kill()


def _run_block(b: Block, script: str, env: dict[str, str], cwd: Path) -> None:
    if b.lang == "python":
        script = f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}\n"
    out_f, err_f = cwd / "block.out", cwd / "block.err"
    with out_f.open("w") as out_w, err_f.open("w") as err_w:
        # files, not pipes: the block's background commands keep their output open
        proc = subprocess.Popen(["bash", "-c", script], env=env, cwd=cwd, stdout=out_w,
                                stderr=err_w, start_new_session=True)
        try:
            proc.wait(timeout=300)
        finally:  # the block's background commands (listeners, servers, a member)
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    out, err = out_f.read_text(), err_f.read_text()
    report = f"{b}:\n{script}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    assert proc.returncode == 0, report
    assert "Traceback" not in err and "internal error" not in err, report
    # (the marker's text is compared with runs of blanks as one, as it was read)
    assert b.expect in " ".join(out.split()), f"expected {b.expect!r}\n{report}"


@pytest.mark.parametrize("doc", DOCS)
def test_document_blocks_run_verbatim(doc: str, overlay: tuple[dict[str, str], Ports],
                                      tmp_path: Path) -> None:
    env, ports = overlay
    # a document's blocks run one after another in one directory, like a user's terminal
    # (relative paths of the guide resolve in a copy of its folder)
    work = tmp_path / "work"
    if doc.startswith("topologies/deploy/"):
        import shutil

        shutil.copytree(ROOT / "topologies" / "deploy", work)
    else:
        work.mkdir()
    for b in blocks(doc):
        if b.runs:
            _run_block(b, ports(b.body), env, work)


def test_uvloop_demo_runs() -> None:
    """`flowrouter --uvloop demo` (the README's fast event loop) carries the demo's traffic."""
    pytest.importorskip("uvloop")
    from .checkout import PYTHONPATH

    proc = subprocess.run([sys.executable, "-m", "flownet.cli", "--uvloop", "demo"],
                          capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": PYTHONPATH})
    assert proc.returncode == 0, proc.stderr
    assert "demo OK" in proc.stdout and proc.stderr == ""
