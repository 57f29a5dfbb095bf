"""Imported by the fork server a pool's workers are forked from (multiprocessing's preload), and nowhere
else: what every worker needs is loaded there once, so a worker starts in milliseconds with it, and the
server has never run a query, so polars' threads are not forked. Polars sizes its thread pool when it is
imported: workers run one per core, on one thread each. The server leaves without the interpreter's
teardown (freeing every module it loaded took 50 ms, which the pool's closing waited for)."""

import atexit
import os

os.environ["POLARS_MAX_THREADS"] = "1"

from pipebubble import _worker  # noqa: E402

_worker.keep_freed_memory()
atexit.register(os._exit, 0)  # run first, at the server's exit (its workers leave by os._exit already)

import pipebubble.executor  # noqa: E402, F401 - the call that runs its units (and the pool worker's loop)
import pipebubble.ingest.json.chrome  # noqa: E402, F401 - the reader of Kineto (Chrome JSON) traces
import pipebubble.ingest.json.trace  # noqa: E402, F401 - a big file's blocks
import pipebubble.run.mapper  # noqa: E402, F401 - the map of rank files
import pipebubble.run.wire  # noqa: E402, F401 - their parts' way back
