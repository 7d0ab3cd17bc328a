"""``corral agent --help``: the agent's flags, llama.cpp's router's and Corral's own."""

from __future__ import annotations

HELP = """\
usage: corral agent [OPTIONS] [LLAMA-SERVER OPTIONS]

llama-server router options (same names, defaults and LLAMA_ARG_* variables):
  --host HOST                 address to listen on, or a unix socket path ending in .sock
                              (default 127.0.0.1)
  --port PORT                 port to listen on (default 8080)
  --models-dir DIR            a folder of GGUF models (a subfolder is one model)
  --models-preset PATH        an INI of model presets, or a folder mounted from the operator
  --models-max N              at most N models loaded at once (default 4; <= 0: no limit)
  --models-autoload / --no-models-autoload
                              load a model when a request names it (default: on)
  --api-key KEY[,KEY]         require one of these keys (all endpoints but /health)
  --api-key-file FILE         keys, one a line
  --ssl-cert-file, --ssl-key-file FILE
                              serve HTTPS with this PEM certificate and key (both needed)
  --cors-origins ORIGINS      allowed origins (default *; 'localhost': localhost, 127.0.0.1
                              and [::1] on any port; localhost by default with tools on)
  --cors-methods, --cors-headers LIST, --cors-credentials / --no-cors-credentials
                              the other CORS headers, as llama-server's
  -to, --timeout SECONDS      read/write timeout towards the children (default 3600)
  --sleep-idle-seconds N      children unload their model after N idle seconds
  --mcp-servers-config FILE, --mcp-servers-json JSON
                              MCP servers (Cursor's "mcpServers" format) that the agent runs
                              for GET/POST /tools; never passed to the children
  --ui-mcp-proxy              serve /cors-proxy for the web UI's remote MCP servers
  --tools TOOL[,TOOL] | all   llama.cpp's built-in tools (read_file, file_glob_search,
                              grep_search, exec_shell_command, write_file, edit_file,
                              get_info) for GET/POST /tools; they run programs: trusted use only
  --tools-runtime WHERE       where they run: docker:IMAGE, podman:IMAGE (a container for the
                              agent's life), docker-container:ID, podman-container:ID, ssh:TARGET
  -ag, --agent / -no-ag, --no-agent
                              all the built-in tools and --ui-mcp-proxy (or neither)

Corral's own:
  --llama-server PATH         the llama-server binary (else $LLAMA_SERVER, PATH, the build of
                              `corral llama-server build`)
  --models-memory-margin MiB  turn the memory ledger on: keep MiB free on every device
  --memory-limit DEV=SIZE     cap what models may use on a device (host=8GiB, CUDA0=20GiB)
  --load-timeout SECONDS      kill a child not ready after this long (default 600)
  --max-body-size SIZE        refuse request bodies larger than this with 413 (default 64MiB)
  --max-download-size SIZE    refuse to download a model file larger than this (e.g. 40GiB)
  --download-redirect-hosts H[,H]
                              hosts a download may be redirected to (.example.com: a domain);
                              its own host and Hugging Face's CDN always are
  --models-ttl DURATION       unload a model idle this long: 600, 10m, 1h (0, -1: never;
                              a preset's ttl wins)
  --queue-timeout SECONDS     a request waiting longer for its model gets 503 + Retry-After
  --max-queue N               at most N requests wait per model; more get 503 + Retry-After
  --warm-cache-size SIZE      warm swaps: prompt caches saved at an unload and restored at
                              the next load of the same model, using at most this much disk
                              (default 2GiB; 0: off)
  --metrics-key-file FILE     keys (one a line; or $CORRAL_METRICS_KEY) that open GET
                              /metrics only, for a scraper (needs --api-key)
  --expect-gpus N             the agent must see N NVIDIA GPUs: with fewer, /health answers
                              503 and says why (a pod that would serve on the CPU is not
                              ready; /livez answers 200 while the agent runs)
  --max-child-errors N        a child that fails N requests in a row with its own 5xx, or
                              stalls one for --timeout, is probed (GET /slots, a one-token
                              completion); one that fails the probe too is killed as wedged
                              and loads again when asked (default 5; 0: only stalls)
  --cpu-turns DURATION        where the children compute on the CPU alone (llama-server
                              --list-devices lists no GPU), each runs a thread per core but
                              one, and models whose child runs several take turns: two at
                              once spin at each other's barriers and both slow down many
                              times over; a turn holds the next model back at most this
                              long, then they share the cores (default 1s; 0: off, as in
                              llama.cpp; one of a single thread, or -C/-Cr, takes none)
  --shutdown-timeout SECONDS  on SIGTERM: drain and stop within this long, then kill (default
                              30; a second SIGTERM/SIGINT kills at once)
  --client-timeout SECONDS    a client must send its request head or body, or take streamed
                              data, within this long; idle connections close (default 30)
  --stream-gather DURATION    a child's stream of 3+ events within this long gathers them for
                              up to this long, then passes them in one piece (default 10ms:
                              fewer wake-ups, so more CPU for the model; 0: each as it comes,
                              as always on systems other than Linux)
  --max-connections N         at most N client connections (default: from ulimit -n); idle
                              and slow ones are closed first, so /health keeps answering
  --log-level LEVEL           debug, info, warning or error (default info)
  --event-loop LOOP           auto (default: uvloop when installed, else asyncio's own),
                              uvloop, or asyncio
  --peer URL                  another agent (http://HOST:PORT; repeatable): a request for a
                              model not loaded here goes, in one hop, to the peer where it is
                              loaded, sleeping or loading, or that has a free slot for it;
                              peers are asked with this agent's --api-key (one key for all)
  --peers-from-service [NAMESPACE/]NAME
                              on Kubernetes: the peers are the serving agents behind this
                              headless Service, kept live from its EndpointSlices (namespace:
                              the pod's own; this agent left out by $POD_NAME / $POD_IP);
                              with --peer too
  --kube-api URL              the Kubernetes API for --peers-from-service, asked as is (e.g.
                              kubectl proxy's http://127.0.0.1:8001; default: in-cluster, with
                              the pod's service-account token and CA)
  --peer-ca-file FILE         PEM certificates (a CA) that sign the peers' own: HTTPS peers
                              are checked against these instead of the system's
  --peer-server-name NAME     the name in the peers' certificates, checked instead of each
                              peer's address (agents that share a certificate for their
                              Service's name, e.g. corral-agent.corral.svc)
  --routing-metrics-port PORT serve, on --host's address and this port, without
                              credentials, only what a router outside the agent needs to
                              choose a node: the models it runs and the requests it queues
                              (the Gateway API Inference Extension's endpoint picker reads
                              them; docs/inference-pool.md). No key is asked there: whoever
                              reaches the port sees the names of the loaded models
  --allowed-hosts NAMES       Host names answered besides local ones (comma-separated; '*':
                              no check; default: a loopback-bound agent answers only to
                              localhost names and IP literals, a guard against DNS rebinding)

Any other option is a llama-server option: it is passed to every child (e.g. -c 4096) and
overrides the presets' values.
"""
