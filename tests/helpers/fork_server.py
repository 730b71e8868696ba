"""A `python` for the processes the task scripts and the comparison start: it forks them from a server that
imported torch and fairseq once (helpers.preload), so each starts in ~0.1 s instead of ~4 s of imports.

`bin_dir()` starts this worker's server and writes two executables into a temporary directory:
``python`` (``python SCRIPT ARGS`` runs SCRIPT as __main__ in a forked child) and ``fairseq-train`` (fairseq's
console script, the same way). The client passes its argv, environment, working directory and its stdin, stdout
and stderr (SCM_RIGHTS) to the server; the child takes them as its own, runs, and its exit status (or signal)
becomes the client's. SIGINT/SIGTERM/SIGHUP sent to the client reach the child; a client killed outright takes
its child with it. What a fork cannot reproduce starts a real interpreter instead (the client execs it):
``-c``/``-m``/options, another PYTHONPATH, no server. RECADAM_TEST_FORK=0: ``bin_dir()`` is the real
interpreter's directory.
"""

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CLIENT = '''#!{real} -IS
import json, os, signal, socket, sys
REAL, SOCK, SCRIPT, PATHS = {real!r}, {sock!r}, {script!r}, {paths!r}
args = sys.argv[1:]
argv = [SCRIPT] + args if SCRIPT else args
if not argv or argv[0].startswith("-") or os.environ.get("PYTHONPATH", "") != PATHS:
    os.execv(REAL, [REAL] + argv)
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(SOCK)
    job = dict(argv=argv, env=dict(os.environ), cwd=os.getcwd(), exe=None if SCRIPT else sys.argv[0])
    socket.send_fds(s, [json.dumps(job).encode()], [0, 1, 2])
except OSError:
    os.execv(REAL, [REAL] + argv)
for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(n, lambda n, f: s.send(json.dumps(dict(signal=n)).encode()))
data = s.recv(4096)  # (a signal's handler runs, then recv goes on: PEP 475)
code = json.loads(data)["code"] if data else 1
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
'''


def _run_child(conn_fds, argv, env, cwd, exe):
    """In the forked child: become ``python ARGV`` with ``env`` in ``cwd`` on the client's stdio, ``exe`` (the
    client ``python``) its sys.executable so that what it starts forks too; never returns."""
    import runpy

    import torch

    for target, fd in enumerate(conn_fds):
        os.dup2(fd, target)
        os.close(fd)
    for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(n, signal.SIG_DFL if n != signal.SIGINT else signal.default_int_handler)
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        if env.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
        if "torch._dynamo" in sys.modules:  # preloaded: its config read the server's environment at the import
            sys.modules["torch._dynamo"].config.disable = env.get("TORCH_COMPILE_DISABLE", "0") == "1"
        sys.argv = list(argv)
        for name in [m for m in sys.modules if m.split(".")[0] == "fairseq_cli"]:
            del sys.modules[name]  # imported again by the script: their logging.basicConfig on its stdout
        sys.executable = exe or sys.executable
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        sys.stdin = open(0, closefd=False)  # the client's, not the server's (/dev/null)
        sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:  # as the interpreter ends a script
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except KeyboardInterrupt:
            code = -signal.SIGINT
        except BaseException:  # noqa: BLE001 - as the interpreter: sys.excepthook (the plug-in's one line), status 1
            sys.excepthook(*sys.exc_info())
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - the child's own set-up failed: say so on the client's stderr
        import traceback

        os.write(2, traceback.format_exc().encode())
    finally:
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)


def serve(path):
    """The server: torch and fairseq imported once, then one forked child per client (single-threaded)."""
    import logging

    import helpers.preload  # noqa: F401

    root = logging.getLogger()  # as a fresh interpreter has it: fairseq_cli configures it in each child
    for h in list(root.handlers):
        root.removeHandler(h)
    root.setLevel(logging.WARNING)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    children = {}  # pid -> client connection
    conns = {}  # client connection -> pid
    while True:
        ready, _, _ = select.select([listener, *conns], [], [], 0.05)
        for c in ready:
            if c is listener:
                conn, _ = listener.accept()
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                job = json.loads(msg)
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    _run_child(fds, job["argv"], job["env"], job["cwd"], job["exe"])
                for fd in fds:
                    os.close(fd)
                children[pid], conns[conn] = conn, pid
                continue
            data = c.recv(4096)
            pid = conns[c]
            if data:  # a signal the client received
                os.kill(pid, json.loads(data)["signal"])
            else:  # the client is gone: so is its child
                os.kill(pid, signal.SIGKILL)
                del conns[c]
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            if conn in conns:
                del conns[conn]
                try:
                    conn.send(json.dumps(dict(code=code)).encode())
                except OSError:
                    pass
            conn.close()


_bin = []
_lock = threading.Lock()


def bin_dir():
    """A directory holding ``python`` and ``fairseq-train`` that fork from this worker's server (started once)."""
    if os.environ.get("RECADAM_TEST_FORK", "1") == "0":
        return os.path.dirname(sys.executable)
    with _lock:
        if _bin:
            return _bin[0]
        d = tempfile.mkdtemp(prefix="fast-python-")
        sock = os.path.join(d, "server.sock")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(HERE),
                                                                        os.environ.get("PYTHONPATH")])))
        server = subprocess.Popen([sys.executable, "-c", f"import helpers.fork_server as f; f.serve({sock!r})"],
                                  env=env, stdin=subprocess.DEVNULL)
        atexit.register(server.kill)
        for _ in range(1200):  # its imports: a few seconds
            if os.path.exists(sock) or server.poll() is not None:
                break
            time.sleep(0.1)
        console = os.path.join(os.path.dirname(sys.executable), "fairseq-train")
        for name, script in (("python", None), ("fairseq-train", console)):
            path = os.path.join(d, name)
            with open(path, "w") as f:
                f.write(CLIENT.format(real=sys.executable, sock=sock, script=script,
                                      paths=os.environ.get("PYTHONPATH", "")))
            os.chmod(path, 0o755)
        _bin.append(d)
        return d


def python():
    """The fast ``python`` (see the module's docstring)."""
    return os.path.join(bin_dir(), "python")
