"""The log and what is folded from it.

Events, the log and its followers, the build's state, the read model, the journal's codec, clocks
and durations. This room imports nothing else of the package.
"""
