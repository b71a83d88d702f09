"""``trt-otel report``: a finished build explained, as an HTML page, markdown or a trace.

One model (:mod:`.model`) folded from the journal's events; each format draws it.
"""
