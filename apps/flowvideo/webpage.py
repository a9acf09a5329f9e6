"""The browser viewer's page (served by :mod:`flowvideo.web` at ``/``).

A bar with the resolution picker (filled from ``/resolutions.json``), the player (``video``:
the page's ``<video>`` element fed with ``/stream.mp4`` through Media Source Extensions, kept
at the live edge; ``mjpeg``: an ``<img>`` on ``/stream.mjpg``), a fit-to-window switch, and
what the viewer sees: pictures per second, delay and stalls. Below, the picture, scaled to
fit the window (keeping its shape) unless fit is off (1:1).

Delay on the page: the queueing delay the web viewer measures on the flow (arrival minus
media time, above the least seen), plus, for the video element, how far behind the newest
buffered picture it plays. Stalls: the flow's gaps longer than the viewer's playout buffer,
plus the video element's ``waiting`` events. URL parameters: ``res=WxH``, ``mode=video|mjpeg``,
``fit=0|1``. The element ids (``res``, ``mode``, ``fit``, ``vid``, ``pic``, ``stats``) are
what the browser tests drive.

Imports nothing.
"""

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>flowvideo</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
html, body { height: 100%; margin: 0; }
body { display: flex; flex-direction: column; font-family: sans-serif; background: #111;
       color: #ddd; }
#bar { display: flex; flex-wrap: wrap; gap: 12px; align-items: center; padding: 6px 8px;
       background: #222; }
#stats { font-variant-numeric: tabular-nums; }
#stage { flex: 1; min-height: 0; display: flex; align-items: center; justify-content: center;
         overflow: auto; }
#vid, #pic { display: none; image-rendering: auto; }
.fit #vid, .fit #pic { width: 100%; height: 100%; object-fit: contain; }
</style></head>
<body>
<div id="bar">
 <label>resolution <select id="res"></select></label>
 <label>player <select id="mode"><option value="video">video</option>
  <option value="mjpeg">mjpeg</option></select></label>
 <label><input type="checkbox" id="fit" checked> fit to window</label>
 <span id="stats">waiting for the stream</span>
</div>
<div id="stage" class="fit">
 <video id="vid" muted autoplay playsinline></video>
 <img id="pic" alt="waiting for the stream">
</div>
<script>
const $ = (id) => document.getElementById(id);
const sel = $('res'), mode = $('mode'), fit = $('fit'), vid = $('vid'), pic = $('pic');
const stage = $('stage'), stats = $('stats');
const q = new URLSearchParams(location.search);
let mp4 = false, session = 0, waiting = 0, lastFrames = null, lastAt = 0;
if (q.get('fit') === '0') fit.checked = false;
stage.className = fit.checked ? 'fit' : '';
fit.onchange = () => { stage.className = fit.checked ? 'fit' : ''; };
vid.addEventListener('waiting', () => { waiting += 1; });

function stop() {
  session += 1;
  pic.removeAttribute('src'); pic.style.display = 'none';
  if (vid.src) { vid.pause(); URL.revokeObjectURL(vid.src); vid.removeAttribute('src');
                 vid.load(); }
  vid.style.display = 'none';
}

function showMjpeg(res) {
  pic.style.display = 'block';
  pic.src = '/stream.mjpg?res=' + res;
}

function showVideo(res) {
  const mine = session;
  const ms = new MediaSource();
  vid.style.display = 'block';
  vid.src = URL.createObjectURL(ms);
  ms.addEventListener('sourceopen', async () => {
    const resp = await fetch('/stream.mp4?res=' + res, {cache: 'no-store'});
    const codec = resp.headers.get('X-Flowvideo-Codec') || 'avc1.42E01E';
    const sb = ms.addSourceBuffer('video/mp4; codecs="' + codec + '"');
    const pending = [];
    const pump = () => {
      if (mine !== session || sb.updating) return;
      const b = vid.buffered;
      if (b.length && vid.currentTime - b.start(0) > 30) {
        sb.remove(b.start(0), vid.currentTime - 10); return;
      }
      if (pending.length) { sb.appendBuffer(pending.shift()); return; }
      if (b.length && b.end(b.length - 1) - vid.currentTime > 0.5) {
        vid.currentTime = b.end(b.length - 1) - 0.05;   // keep to the live edge
      }
      if (vid.paused) vid.play().catch(() => {});
    };
    sb.addEventListener('updateend', pump);
    const reader = resp.body.getReader();
    while (mine === session) {
      const {value, done} = await reader.read();
      if (done) break;
      pending.push(value); pump();
    }
    reader.cancel().catch(() => {});
  });
}

function show() {
  stop();
  const res = sel.value;
  if (!res) { stats.textContent = 'no stream advertised yet'; return; }
  history.replaceState(null, '', '?res=' + res + '&mode=' + mode.value +
                       (fit.checked ? '' : '&fit=0'));
  lastFrames = null;
  if (mode.value === 'video' && mp4 && window.MediaSource) showVideo(res);
  else showMjpeg(res);
}

async function status() {
  try {
    const d = await (await fetch('/status.json', {cache: 'no-store'})).json();
    const v = d.viewers.find((x) => x.resolution === sel.value);
    if (!v) return;
    const now = performance.now() / 1000;
    const fps = lastFrames === null ? 0 : (v.frames - lastFrames) / (now - lastAt);
    lastFrames = v.frames; lastAt = now;
    let delay = v.delay, behind = 0;
    if (vid.style.display === 'block' && vid.buffered.length) {
      behind = Math.max(0, vid.buffered.end(vid.buffered.length - 1) - vid.currentTime);
    }
    stats.textContent = sel.value + ' · ' + fps.toFixed(1) + ' fps · delay ' +
      (delay + behind).toFixed(2) + ' s · stalls ' + (v.underruns + waiting) +
      (v.lost ? ' · lost ' + v.lost : '');
    stats.dataset.fps = fps.toFixed(2);
    stats.dataset.delay = (delay + behind).toFixed(3);
    stats.dataset.stalls = String(v.underruns + waiting);
  } catch (e) { /* the server is busy or gone: try again */ }
}

sel.onchange = show;
mode.onchange = show;
fetch('/resolutions.json').then((r) => r.json()).then((d) => {
  mp4 = d.mp4;
  if (!mp4) mode.value = 'mjpeg';
  for (const o of d.offers) {
    const opt = document.createElement('option');
    opt.value = opt.textContent = o.resolution; sel.appendChild(opt);
  }
  if (q.get('res')) sel.value = q.get('res');
  if (q.get('mode') && mp4) mode.value = q.get('mode');
  if (q.get('mode') === 'mjpeg') mode.value = 'mjpeg';
  show();
  setInterval(status, 1000);
});
</script></body></html>
"""
