"""The choices the renderers offer, as plain values: the time units (``--timeunit``), the CSV tables
(``--table``), the rows of a top-N table (``--top``) and the formats check and diff write. They sit below the
registry (``formats``) and every renderer, so that both read them without importing each other, and the CLI
builds its flags without loading a renderer.
"""

from __future__ import annotations

TIME_UNITS = ("ns", "us", "ms", "s")  # --timeunit: the keys of cells.UNITS
# --table: the keys of csv_table.TABLES
CSV_TABLES = ("kernels", "breakdown", "lanes", "waits", "stages", "replicas", "workers", "memory", "memory_stages",
              "requests", "memcpy", "gpu_annotations", "launch_queue", "launch_delays", "flops", "flops_ops",
              "flops_stages", "flops_steps")
TOP = 15  # --top: rows of the kernel, runtime API and range tables

#: check and diff offer the same five formats, chosen by --format only (``render.gates.FORMATS`` is their names).
GATE_FORMATS = (("text", (".txt",), "the verdict, one line per gate or metric"),
                ("json", (".json",), "the verdict as JSON"),
                ("junit", (".xml",), "JUnit XML for CI (junit-10)"),
                ("github", (), "GitHub Actions annotations"),
                ("markdown", (".md", ".markdown"), "GitHub Markdown, passing rows folded"))
