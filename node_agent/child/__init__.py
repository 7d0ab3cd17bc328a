"""llama-server children: spawning, supervising and stopping one process per model.

- :mod:`.process` — :class:`~.process.ChildProcess`, the supervisor (one owner task per child)
- :mod:`.spawn` — :class:`~.spawn.ChildConfig`, the command line and environment
- :mod:`.launched` — a started child: its exit, signals and stdin
- :mod:`.protocol` — llama.cpp's parent–child protocol lines
- :mod:`.state` — states, allowed transitions, events, snapshots
- :mod:`.logs` — the ring buffer of a child's stderr
- :mod:`.streams` — pipe line reader and ``/health`` probe
- :mod:`.ports`, :mod:`.pdeathsig`, :mod:`.orphans` — free ports, dying with the agent, and
  ending what an earlier agent left behind

**Spawn.** ``binary *args --host 127.0.0.1 --port P`` with P picked free by the agent (see
:mod:`.ports` for why not ``--port 0``), its own process group in the agent's session (see
:mod:`.launched` for why not a session of its own), ``PR_SET_PDEATHSIG``
(SIGKILL) so it dies with the agent, and environment ``os.environ`` + ``config.env`` +
``LLAMA_SERVER_ROUTER_PORT`` (turns the protocol on; the pinned binary only checks that it is
set) + ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (GPU indices agree with NVML) + the agent tag (see
:mod:`.orphans`). A child that exits with ``couldn't bind HTTP server socket`` before loading
lost the port to someone else: it is spawned again on another port (``port_attempts`` in all).

**Ready** = a ``ready`` state line confirmed by ``GET /health`` 200; a binary that never speaks
the protocol is ready on ``/health`` 200 alone. ``/health`` is polled from spawn with backoff
(5 ms up to 250 ms), and fast again as soon as the ``ready`` line comes. No ready within
``load_timeout`` (counted from the first spawn): the child is killed and ``start()`` raises.

**Stop.** A child that is still starting or loading is SIGKILLed at once (its process group).
A loaded one is asked to exit — ``cmd_router_to_child:exit`` on stdin when it speaks the
protocol, else SIGTERM — and its process group is SIGKILLed after ``stop_timeout``. Measured
with the pinned binary: SIGTERM alone never stops a protocol child (its stdin thread stays
blocked in read); an exit command sent right after ``ready`` is lost about one time in ten
(llama.cpp's stdin thread runs before its main loop does), so a protocol child still there
0.5 s after the command also gets one SIGTERM, which, after the command, neither hangs nor
trips llama.cpp's "second signal = exit(1)". A request in flight does *not* finish once the
child is told to exit: it hangs until the client goes or the SIGKILL comes. Drain before
calling ``stop()``; ``stop_timeout`` only bounds the wait.

**Exit codes** are ``asyncio``'s: negative for a signal (-9 after SIGKILL). The pinned binary
exits 0 on the exit command, 1 on stdin EOF when idle, and may die of SIGSEGV on stdin EOF with
a request in flight.
"""
