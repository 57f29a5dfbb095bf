"""pipebubble: how much of every GPU millisecond holds useful work, stage by stage."""

__version__ = "0.1.0"
