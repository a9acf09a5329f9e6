"""flowvideo: multi-resolution video over one flow (seed 002 section 5.2).

A streamer publishes one flow: an advertisement band listing the resolutions and their bands,
a request band on which viewers ask for one, a feedback band for congestion reports, a state
band a backup streamer follows (Figure 3.3), and one band per active resolution. Routers
filter by band, so a link carries only the resolutions someone below it watches.

=============================  ============================================================
:mod:`flowvideo.protocol`     bands and message formats (sans-I/O)
:mod:`flowvideo.streamer_core`  the streamer's and backup's decisions (sans-I/O)
:mod:`flowvideo.ratecontrol`  one band's rate, quality and scale under congestion (sans-I/O)
:mod:`flowvideo.viewer_core`  a viewer's decisions and playout accounting (sans-I/O)
:mod:`flowvideo.sources`      test pattern, X screen, image files; JPEG via Pillow
:mod:`flowvideo.streamer`     the streamer's asyncio shell
:mod:`flowvideo.viewer`       the viewer's asyncio shell (with make-before-break moves)
:mod:`flowvideo.web`          the browser viewer: a small HTTP server sending MJPEG
:mod:`flowvideo.demo`         ``flowvideo demo``: a small topology, two viewers
:mod:`flowvideo.cli`          ``flowvideo serve | watch | web | demo``
=============================  ============================================================

May import flowlib, flowdir, flowrouter.wire and flowrouter.testbed, and Pillow.
"""
