"""What runs beside or around the native calls: the child processes every variant runs in (``child``),
native calls that can abort, run in a child (``guard``), llama.cpp's logs into Python ``logging``
(``logs``), and the slices of a long run (``shard``)."""
