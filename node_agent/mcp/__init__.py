"""MCP servers the agent runs for its clients (llama.cpp's ``--mcp-servers-config``/``-json``).

In llama.cpp's router mode the router process itself answers ``GET/POST /tools``: chat requests
never call a tool on their own; the client (llama.cpp's web UI) lists the tools, passes their
definitions in a chat completion's ``tools``, runs the tool calls the model answers with through
``POST /tools`` and sends the results back as ``tool`` messages. Corral does the same in the
agent, so a child that crashes or is evicted takes no MCP server with it.
"""
