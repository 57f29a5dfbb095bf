"""Renderers: a Report in, a string (or rich renderable) out. They never compute and never print."""
