"""llama.cpp's built-in tools (``--tools``, ``--tools-runtime``, ``--agent``), run by the agent.

``names`` is what the command line may name (pure, imported at parse time); ``params`` reads
a call's arguments as llama.cpp's JSON library does; ``globs`` and ``edits`` are the pure parts
of the tools; ``process`` runs a program with bounded output and time; ``grep`` runs
``grep_search``'s pattern in a process of its own (``grep_worker``), bounded in time; ``io`` is
where a tool's files and programs are (the host, a container, an ssh host); ``container`` owns
the container of ``--tools-runtime docker:<image>``; ``builtin`` defines the tools;
``toolbox`` is what ``GET/POST /tools`` use; ``reaper`` runs a host program so that what it
starts dies with it. Nothing here is imported unless the agent's own flags turn tools on.
"""
