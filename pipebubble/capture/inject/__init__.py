"""Files put on the profiled program's PYTHONPATH; they run in that program's interpreter, stdlib + torch only."""
