"""Fault schedules and scenarios in topology files: one-off faults (``at``/``until``: down, or
bandwidth/delay/loss changes), repeating outages (``start``, ``down``, ``up``), and named
scenarios that group them.

May import the model and :mod:`flowrouter.testbed.topology.values`.
"""

from __future__ import annotations

from typing import Any

from flowrouter.testbed.topology.model import Fault, Scenario
from flowrouter.testbed.topology.values import ValueChecker, known_names


class ScheduleParser(ValueChecker):
    """Fault schedules (one-off and repeating) and named scenarios."""

    def faults(self, value: Any, path: tuple[Any, ...], link_ends: dict[str, tuple[str, str]],
               where: str = "") -> tuple[Fault, ...]:
        if not isinstance(value, list):
            raise self.fail(path, f"{where}faults must be an array of tables")
        out = []
        for i, item in enumerate(value):
            out.append(self.fault(item, path + (i,), f"{where}fault #{i + 1}", link_ends))
        return tuple(out)

    def fault(self, item: Any, p: tuple[Any, ...], what: str,
              link_ends: dict[str, tuple[str, str]]) -> Fault:
        tbl = self.table(item, p, what)
        self.keys(tbl, p, ("link", "links", "at", "until", "down", "up", "start", "direction",
                           "bandwidth", "delay", "loss"), what)
        if ("link" in tbl) == ("links" in tbl):
            raise self.fail(p, f"{what} needs exactly one of 'link' or 'links'")
        if "link" in tbl:
            names = [tbl["link"]]
            lp = [p + ("link",)]
        else:
            if not isinstance(tbl["links"], list) or not tbl["links"]:
                raise self.fail(p + ("links",), f"{what}: links must be a non-empty array of "
                                                "link names")
            names = tbl["links"]
            lp = [p + ("links", j) for j in range(len(names))]
        for n, np_ in zip(names, lp):
            if not isinstance(n, str) or n not in link_ends:
                raise self.fail(np_, f"{what}: unknown link {n!r} (known: "
                                     f"{known_names(list(link_ends))})")
        if len(set(names)) != len(names):
            raise self.fail(p, f"{what} names a link twice")

        def t(key: str, lo_open: bool = False) -> float | None:
            if key not in tbl:
                return None
            return self.number(tbl[key], p + (key,), f"{what} {key}", lo_open=lo_open,
                               time=True)

        at, until, down, up, start = t("at"), t("until"), t("down", True), t("up", True), \
            t("start")
        direction = None
        if "direction" in tbl:
            direction = tbl["direction"]
            for n in names:
                if direction not in link_ends[n]:
                    raise self.fail(p + ("direction",), f"{what}: direction {direction!r} is "
                                    f"not an end of link {n!r} ({' - '.join(link_ends[n])}); "
                                    "name the router whose outgoing frames are affected")
        setting = [k for k in ("bandwidth", "delay", "loss") if k in tbl]
        bw = dl = ls = None
        if "bandwidth" in tbl:
            bw = self.number(tbl["bandwidth"], p + ("bandwidth",), f"{what} bandwidth",
                             bandwidth=True)
        if "delay" in tbl:
            dl = self.number(tbl["delay"], p + ("delay",), f"{what} delay", time=True)
        if "loss" in tbl:
            ls = self.number(tbl["loss"], p + ("loss",), f"{what} loss probability", hi=1.0)
        repeating = [k for k in ("down", "up", "start") if k in tbl]
        if repeating:
            if "at" in tbl:
                raise self.fail(p + ("at",), f"{what}: 'at' is for one-off faults; a "
                                             "repeating fault uses start, down, up [, until]")
            missing = [k for k in ("down", "up", "start") if k not in tbl]
            if missing:
                raise self.fail(p, f"{what}: a repeating fault needs down, up and start "
                                   f"(missing {', '.join(missing)})")
            if setting:
                raise self.fail(p + (setting[0],), f"{what}: a repeating fault is an outage; "
                                f"'{setting[0]}' belongs in a one-off fault with at/until")
            assert start is not None
            if until is not None and until <= start:
                raise self.fail(p + ("until",), f"{what}: schedule times out of order: until "
                                                f"({until:g}) must be after start "
                                                f"({start:g})")
        else:
            if at is None:
                raise self.fail(p, f"{what} needs 'at' (a one-off fault) or start/down/up (a "
                                   "repeating outage)")
            if until is not None and until <= at:
                raise self.fail(p + ("until",), f"{what}: schedule times out of order: until "
                                                f"({until:g}) must be after at ({at:g})")
        return Fault(tuple(names), at, until, down, up, start, direction, bw, dl, ls)

    def scenarios(self, value: Any, link_ends: dict[str, tuple[str, str]]
                  ) -> tuple[Scenario, ...]:
        tbl = self.table(value, ("scenarios",), "[scenarios]")
        out = []
        for name, sc in tbl.items():
            p = ("scenarios", name)
            self.name(name, p, "scenario name")
            st = self.table(sc, p, f"scenario {name!r}")
            self.keys(st, p, ("description", "faults", "duration"), f"scenario {name!r}")
            desc = self.text_(st.get("description", ""), p + ("description",), "description")
            dur = None
            if "duration" in st:
                dur = self.number(st["duration"], p + ("duration",), f"scenario {name!r} "
                                  "duration", lo_open=True, time=True)
            faults = self.faults(st.get("faults", []), p + ("faults",), link_ends,
                                 f"scenario {name!r} ")
            out.append(Scenario(name, desc, faults, dur))
        return tuple(out)
