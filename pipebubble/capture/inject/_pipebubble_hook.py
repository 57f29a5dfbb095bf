"""Runs inside the profiled process, loaded by the sitecustomize next to it.

Standard library only until the program imports torch; then it decides whether this process is one to
profile (a worker, not torchrun's agent, not a child of a profiled process) and drives torch.profiler.
The runner passes its settings as JSON in the PIPEBUBBLE_CAPTURE environment variable.
"""

import atexit
import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import threading

CONFIG_ENV = "PIPEBUBBLE_CAPTURE"
# Set by a profiled process for its own children: a fork/spawn child (DataLoader worker, multiprocessing)
# inherits it and so knows it is not a process to profile.
OWNER_ENV = "PIPEBUBBLE_CAPTURE_OWNER"
# "PID" or "PID:launcher", set by each process of the capture for its children: who started them, and
# whether that process starts its children from the thread that outlives them (see _die_with_parent).
PARENT_ENV = "PIPEBUBBLE_CAPTURE_PARENT"
_LAUNCHERS = ("torchrun", "torch/distributed/run.py", "torch/distributed/launch.py")
_PR_SET_PDEATHSIG = 1


def install() -> None:
    raw = os.environ.get(CONFIG_ENV)
    if not raw:
        return
    try:
        _die_with_parent()
    except Exception as exc:  # only a safety net: profiling goes ahead without it
        _warn(f"pid {os.getpid()} will not die with its parent: {exc!r}")
    os.environ[PARENT_ENV] = str(os.getpid())
    if os.environ.get(OWNER_ENV):
        return
    config = json.loads(raw)
    sys.meta_path.insert(0, _AfterImport({
        "torch": lambda torch: _on_torch(torch, config),
        "torch.distributed.pipelining.schedules": _on_pipelining,
    }))


def _warn(message: str) -> None:
    print(f"pipebubble: {message}", file=sys.stderr)


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies, where that is safe (Linux only).

    A killed capture kills its child; this carries that down the tree, so torchrun's workers (in
    sessions of their own, out of reach of a process-group signal) do not outlive a killed torchrun.
    The signal fires when the parent *thread* that started us ends, and on purpose when the parent
    ends, so it is set only where neither can surprise a program: the parent is a process of this
    capture and either a launcher (which starts and waits for its children on its main thread) or a
    single-threaded process in our own session (a child put in a new session may be meant to outlive it)."""
    pid, _, kind = os.environ.get(PARENT_ENV, "").partition(":")
    parent = os.getppid()
    if not sys.platform.startswith("linux") or pid != str(parent):
        return
    if kind != "launcher" and not (_threads(parent) == 1 and _same_session(parent)):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(int(signal.SIGKILL)))
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the signal was set: too late for it to fire
        os.kill(os.getpid(), signal.SIGKILL)


def _threads(pid: int) -> int:
    """How many threads process `pid` runs (0 when that cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _same_session(pid: int) -> bool:
    try:
        return os.getsid(0) == os.getsid(pid)
    except OSError:
        return False


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls callbacks[name](module) once that module has finished executing (a post-import hook)."""

    def __init__(self, callbacks):
        self.callbacks = dict(callbacks)

    def find_spec(self, name, path=None, target=None):
        # Only wrap here: importlib.util.find_spec("torch") (a probe, no import) comes through too.
        if name not in self.callbacks:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if finder is not self and find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenCall(spec.loader, lambda module: self._fire(name, module))
                return spec
        return None

    def _fire(self, name, module):
        callback = self.callbacks.pop(name, None)
        if callback is not None:
            callback(module)


class _ThenCall:
    def __init__(self, loader, callback):
        self._loader, self._callback = loader, callback

    def __getattr__(self, attr):
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader
        try:
            self._callback(module)
        except Exception as exc:  # profiling must never break the user's program
            _warn(f"profiling not started in pid {os.getpid()}: {exc!r}")


def _is_launcher() -> bool:
    argv0 = (sys.argv[0] if sys.argv else "").replace(os.sep, "/")
    return any(argv0.endswith(name) for name in _LAUNCHERS)


def _should_profile(config) -> bool:
    launcher = _is_launcher()
    if "RANK" in os.environ:
        return not launcher
    return not (launcher or config.get("only_ranks"))


def _on_torch(torch, config) -> None:
    if _is_launcher():
        # torchrun imports torch before it starts the workers, so they see this: they may die with it.
        os.environ[PARENT_ENV] = f"{os.getpid()}:launcher"
    if not _should_profile(config):
        return
    os.environ[OWNER_ENV] = str(os.getpid())
    _Session(torch, config).start()


def _on_pipelining(schedules) -> None:
    if os.environ.get(OWNER_ENV) == str(os.getpid()):
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_pipebubble_pplabels.py")
        spec = importlib.util.spec_from_file_location("_pipebubble_pplabels", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.install(schedules)


class _Session:
    """One process's profiler, from `import torch` to exit (normal, os._exit or SIGTERM)."""

    def __init__(self, torch, config):
        self.torch, self.config = torch, config
        self.pid = os.getpid()
        self.rank = int(os.environ.get("RANK", "0"))
        self.total = config["wait"] + config["warmup"] + config["active"]
        self.trace = os.path.join(config["out"], f"rank{self.rank}.pt.trace.json.gz")
        self.steps, self.optimizer = 0, None
        self.recording = self.window_done = self.finished = self.dist_in_trace = False
        self.written, self.problem, self.hook = False, None, None

    def start(self) -> None:
        profiler = importlib.import_module("torch.profiler")
        activities = [profiler.ProfilerActivity.CPU]
        # device_count asks NVML, unlike is_available, so a program that forks CUDA workers still can.
        if self.torch.cuda.device_count() > 0:
            activities.append(profiler.ProfilerActivity.CUDA)
        kwargs = {"activities": activities, "record_shapes": self.config["record_shapes"],
                  "on_trace_ready": self._write}
        if self.config["mode"] == "steps":
            c = self.config
            kwargs["schedule"] = profiler.schedule(wait=c["wait"], warmup=c["warmup"], active=c["active"], repeat=1)
        self.prof = profiler.profile(**kwargs)
        self._watch_foreign_profilers()
        if self.config["mode"] == "steps":
            optimizer = importlib.import_module("torch.optim.optimizer")
            self.hook = optimizer.register_optimizer_step_post_hook(self._on_step)
        self.prof.start()
        self._note_recording()
        self._install_exit_paths()

    def _note_recording(self) -> None:
        if not self.recording and self.prof.current_action.name.startswith("RECORD"):
            self.recording = True
            self.dist_in_trace = self._dist_live() is not None  # torch adds distributedInfo itself then

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
        """Export under a hidden temporary name, then rename: a trace name only ever holds a whole trace.

        The pid in the temporary name keeps two processes that claim the same rank from mixing their
        halves. A failure is recorded, not raised: this runs inside the program's step() or exit."""
        if self.problem is not None and self.problem.startswith("own_profiler"):
            return
        partial = os.path.join(self.config["out"], f".rank{self.rank}.{self.pid}.partial.json.gz")
        try:
            prof.export_chrome_trace(partial)
            os.replace(partial, self.trace)
        except Exception as exc:
            self.problem = self.problem or f"flush_failed: {exc!r}"
            _remove(partial)
            return
        self.written = True

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
        real_exit = os._exit

        def _exit(code):
            self.finish()
            real_exit(code)

        os._exit = _exit
        on_main = threading.current_thread() is threading.main_thread()
        if on_main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self.finished = True  # a forked child shares our state but must not write our trace

    def _on_sigterm(self, signum, frame) -> None:
        self.finish()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

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
        """Tell the runner how this rank went, in a hidden file renamed into place once whole.

        Runs at exit: a failure is one line on stderr, never a traceback after the program's output."""
        status = {
            "rank": self.rank, "pid": self.pid, "torch": self.torch.__version__,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "devices": self._devices(),
            "optimizer_steps": self.steps, "trace": os.path.basename(self.trace) if self.written else None,
            "problem": self.problem,
        }
        out = self.config["out"]
        path = os.path.join(out, f".rank{self.rank}.status.json")
        partial = os.path.join(out, f".rank{self.rank}.{self.pid}.status.tmp")
        try:
            with open(partial, "w") as f:
                json.dump(status, f)
            os.replace(partial, path)
        except Exception as exc:
            _remove(partial)
            _warn(f"rank {self.rank}: could not report to pipebubble capture: {exc}")

    def _devices(self) -> list:
        cuda = self.torch.cuda
        try:
            used = cuda.is_initialized()  # name the GPUs only if the program used them
            return ["cpu"] + ([cuda.get_device_name(i) for i in range(cuda.device_count())] if used else [])
        except Exception:  # a GPU gone bad by exit time must not cost the rank its status
            return ["cpu"]


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
