"""Chrome-trace JSON (torch.profiler/Kineto writes it too): the header, the ``traceEvents`` array cut into
blocks and decoded by type into columns, the tolerant path, and the spans made of them (``chrome``)."""
