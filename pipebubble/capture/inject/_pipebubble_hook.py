"""Runs inside the profiled process, loaded by the sitecustomize next to it.

Standard library only until the program imports torch; then it decides whether this process is one to
profile (a worker, not torchrun's agent, not a child of a profiled process) and drives torch.profiler.
The runner passes its settings as JSON in the PIPEBUBBLE_CAPTURE environment variable. Its helpers sit
next to it and are loaded by file path, like it: the child's interpreter needs no pipebubble install.
"""

import atexit
import importlib.util
import json
import os
import signal
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


def _sibling(name: str):
    """Load the module `name`.py next to this file (by path: the program's sys.path is its own)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ending = _sibling("_pipebubble_exit")
_files = _sibling("_pipebubble_files")
_imports = _sibling("_pipebubble_imports")
_parent = _sibling("_pipebubble_parent")

CONFIG_ENV = "PIPEBUBBLE_CAPTURE"
# Set by a profiled process for its own children: a fork/spawn child (DataLoader worker, multiprocessing)
# inherits it and so knows it is not a process to profile.
OWNER_ENV = "PIPEBUBBLE_CAPTURE_OWNER"
PARENT_ENV = _parent.PARENT_ENV


def install() -> None:
    raw = os.environ.get(CONFIG_ENV)
    if not raw:
        return
    try:
        _parent.die_with_parent()
    except Exception as exc:  # only a safety net: profiling goes ahead without it
        _warn(f"pid {os.getpid()} will not die with its parent: {exc!r}")
    _parent.become_parent()
    if os.environ.get(OWNER_ENV):
        return
    config = json.loads(raw)
    callbacks = {
        "torch": lambda torch: _on_torch(torch, config),
        "torch.distributed.pipelining.schedules": _on_pipelining,
    }
    sys.meta_path.insert(0, _imports.AfterImport(callbacks, _not_started))


def _warn(message: str) -> None:
    print(f"pipebubble: {message}", file=sys.stderr)


def _not_started(exc: Exception) -> None:
    _warn(f"profiling not started in pid {os.getpid()}: {exc!r}")


def _should_profile(config) -> bool:
    launcher = _parent.is_launcher()
    if "RANK" in os.environ:
        return not launcher
    return not (launcher or config.get("only_ranks"))


def _on_torch(torch, config) -> None:
    if _parent.is_launcher():
        # torchrun imports torch before it starts the workers, so they see this: they may die with it.
        _parent.become_parent(launcher=True)
    if not _should_profile(config):
        return
    os.environ[OWNER_ENV] = str(os.getpid())
    _Session(torch, config).start()


def _on_pipelining(schedules) -> None:
    if os.environ.get(OWNER_ENV) == str(os.getpid()):
        _sibling("_pipebubble_pplabels").install(schedules)


class _Session:
    """One process's profiler, from `import torch` to exit (normal, os._exit or SIGTERM)."""

    def __init__(self, torch, config):
        self.torch, self.config = torch, config
        self.pid = os.getpid()
        self.rank = int(os.environ.get("RANK", "0"))
        self.total = config["wait"] + config["warmup"] + config["active"]
        self.trace = _files.trace_path(config["out"], self.rank)
        self.steps, self.optimizer = 0, None
        self.recording = self.window_done = self.finished = self.dist_in_trace = False
        self.written, self.problem, self.hook = False, None, None
        self.exit_code, self.error, self.phase = None, None, None  # how the program ended, as far as seen
        self.failed_at = None  # when: of ranks that fail, the first is the cause, the others its victims

    def start(self) -> None:
        profiler = importlib.import_module("torch.profiler")
        activities = [profiler.ProfilerActivity.CPU]
        # device_count asks NVML, unlike is_available, so a program that forks CUDA workers still can.
        if self.torch.cuda.device_count() > 0:
            activities.append(profiler.ProfilerActivity.CUDA)
        shapes = self.config["record_shapes"]
        kwargs = {"activities": activities, "record_shapes": shapes, "with_flops": shapes,
                  "profile_memory": self.config["profile_memory"], "on_trace_ready": self._write}
        if self.config["mode"] == "steps":
            c = self.config
            kwargs["schedule"] = profiler.schedule(wait=c["wait"], warmup=c["warmup"], active=c["active"], repeat=1)
        self.prof = profiler.profile(**kwargs)
        self._watch_foreign_profilers()
        if self.config["mode"] == "steps":
            optimizer = importlib.import_module("torch.optim.optimizer")
            self.hook = optimizer.register_optimizer_step_post_hook(self._on_step)
        self.prof.start()
        self._progress("started")
        self._note_recording()
        self._install_exit_paths()

    def _note_recording(self) -> None:
        if not self.recording and self.prof.current_action.name.startswith("RECORD"):
            self.recording = True
            self.dist_in_trace = self._dist_live() is not None  # torch adds distributedInfo itself then
            self._progress("recording")

    def _progress(self, phase: str) -> None:
        """Tell the runner how far this rank has got; never at the program's expense."""
        if phase == self.phase:
            return
        self.phase = phase
        state = {"rank": self.rank, "pid": self.pid, "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                 "phase": phase, "steps": self.steps}
        try:
            _files.write_progress(state, self.config["out"], self.rank, self.pid)
        except Exception:  # progress is a courtesy; the status at exit is what counts
            pass

    def _on_step(self, optimizer, args, kwargs) -> None:
        if os.getpid() != self.pid or self.window_done or self.problem:
            return
        # Count one optimizer only, so that a step is a training step even with several optimizers.
        self.optimizer = self.optimizer if self.optimizer is not None else id(optimizer)
        if id(optimizer) != self.optimizer:
            return
        self.steps += 1
        try:
            if self.steps == self.total:
                self._add_dist_info()  # the step() below ends the recording
            self.prof.step()
            self._note_recording()
        except Exception as exc:  # this runs inside the program's optimizer.step(): never raise there
            self.problem = self.problem or f"flush_failed: {exc!r}"
            self.window_done = True
        if self.steps >= self.total or self.window_done:
            self.window_done = True
            self.hook.remove()

    def _dist_live(self):
        dist = importlib.import_module("torch.distributed")
        if dist.is_available() and dist.is_initialized():
            return {"backend": str(dist.get_backend()), "rank": dist.get_rank(), "world_size": dist.get_world_size()}
        return None

    def _add_dist_info(self) -> None:
        # torch records distributedInfo when recording starts; a window that began before
        # init_process_group (say --mode run) would otherwise lose the rank.
        if self.dist_in_trace or not self.recording:
            return
        info = self._dist_live()
        if info is None and "RANK" in os.environ:
            info = {"rank": self.rank, "world_size": int(os.environ.get("WORLD_SIZE", "1"))}
        if info is not None:
            self.prof.add_metadata_json("distributedInfo", json.dumps(info))
            self.dist_in_trace = True

    def _write(self, prof) -> None:
        """Export the trace, whole or not at all (see _pipebubble_files).

        A failure is recorded, not raised: this runs inside the program's step() or exit."""
        if self.problem is not None and self.problem.startswith("own_profiler"):
            return
        self._progress("writing")
        try:
            _files.write_trace(prof.export_chrome_trace, self.config["out"], self.rank, self.pid, self.trace)
        except Exception as exc:
            self.problem = self.problem or f"flush_failed: {exc!r}"
            return
        self.written = True
        self._progress("written")

    def _watch_foreign_profilers(self) -> None:
        # Both torch.profiler.profile and the legacy autograd profiler go through _prepare_trace;
        # two profilers cannot run at once, so when the program starts its own, ours steps aside.
        legacy = importlib.import_module("torch.autograd.profiler").profile
        original, session = legacy._prepare_trace, self

        def _prepare_trace(prof_self, *args, **kwargs):
            if os.getpid() == session.pid and prof_self is not getattr(session.prof, "profiler", None):
                session.step_aside()
            return original(prof_self, *args, **kwargs)

        legacy._prepare_trace = _prepare_trace

    def step_aside(self) -> None:
        if self.problem is not None:
            return
        self.problem = "own_profiler"
        if self.hook is not None:
            self.hook.remove()
        try:
            self.prof.stop()
        except Exception:  # it may not have been started by the schedule yet; nothing to release then
            pass

    def _install_exit_paths(self) -> None:
        atexit.register(self.finish)
        real_exit, real_sys_exit, previous_hook = os._exit, sys.exit, sys.excepthook

        def _exit(code):
            self._noting(self.note_exit, code)
            self.finish()
            real_exit(code)

        def sys_exit(status=None):
            self._noting(self.note_exit, status)
            real_sys_exit(status)

        def excepthook(kind, value, tb):
            self._noting(self.note_error, kind, value)
            previous_hook(kind, value, tb)

        # torch.distributed wraps sys.excepthook in turn (to prefix [rankN]) and calls this one.
        os._exit, sys.exit, sys.excepthook = _exit, sys_exit, excepthook
        on_main = threading.current_thread() is threading.main_thread()
        if on_main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self.finished = True  # a forked child shares our state but must not write our trace

    def _on_sigterm(self, signum, frame) -> None:
        self.note_exit(128 + signum)
        self.finish()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    @staticmethod
    def _noting(note, *args) -> None:
        try:
            note(*args)
        except Exception:  # the program's exit and traceback come first; the reason is a courtesy
            pass

    def note_exit(self, status) -> None:
        """The exit status the program asked for (sys.exit, os._exit, a signal): the runner's "rank R exited
        with code C" and the reason it gives."""
        if os.getpid() == self.pid:
            self.exit_code, self.error = _ending.from_status(status)
            self.failed_at = time.time() if self.exit_code else None

    def note_error(self, kind, value) -> None:
        """An uncaught exception: the line a traceback ends with (ModuleNotFoundError: No module named ...)."""
        if os.getpid() == self.pid:
            self.exit_code, self.error = _ending.from_exception(kind, value)
            self.failed_at = time.time()

    def finish(self) -> None:
        if os.getpid() != self.pid or self.finished:
            return
        self.finished = True
        try:
            self._stop()
        except Exception as exc:
            self.problem = self.problem or f"flush_failed: {exc!r}"
        self._write_status()

    def _stop(self) -> None:
        if self.problem is not None or self.window_done:
            return
        if self.recording:
            self._add_dist_info()
            self.prof.stop()
            if self.config["mode"] == "steps":
                self.problem = self.problem or f"partial: the program ended after {self.steps} of {self.total} steps"
        else:
            self.problem = f"before_active: the program ended after {self.steps} optimizer step(s)"

    def _write_status(self) -> None:
        """Tell the runner how this rank went, in a file that appears only once whole.

        Runs at exit: a failure is one line on stderr, never a traceback after the program's output."""
        status = {
            "rank": self.rank, "pid": self.pid, "torch": self.torch.__version__,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "devices": self._devices(),
            "optimizer_steps": self.steps, "trace": os.path.basename(self.trace) if self.written else None,
            "problem": self.problem, "exit_code": self.exit_code, "error": self.error, "failed_at": self.failed_at,
        }
        try:
            _files.write_status(status, self.config["out"], self.rank, self.pid)
        except Exception as exc:
            _warn(f"rank {self.rank}: could not report to pipebubble capture: {exc}")

    def _devices(self) -> list:
        cuda = self.torch.cuda
        try:
            used = cuda.is_initialized()  # name the GPUs only if the program used them
            return ["cpu"] + ([cuda.get_device_name(i) for i in range(cuda.device_count())] if used else [])
        except Exception:  # a GPU gone bad by exit time must not cost the rank its status
            return ["cpu"]

