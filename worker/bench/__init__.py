"""The scenarios behind ``genq bench``: each sends the same work to the variants it compares,
times each phase apart (``time.perf_counter``) and returns numbers a table is made from.

==================  =========================================================================
module              what it measures
==================  =========================================================================
``modes``           an engine in-process against the same engine through the queue (static,
                    continuous); the shared helpers (percentiles, the machine's description)
``aging``           what each priority waits under a low-priority backlog
``preemption``      preemption and time slices on and off: a high request behind running
                    low ones, a low backlog's speed, short requests beside long ones
                    (``--scenario priority``)
``fleet``           a fleet of workers against an ideal central queue
``models``          two models on one queue and one gateway, mixed, a worker killed: answers
                    by the wrong model, texts against each model's alone
``model_pool``      echo workers with a pool of models each, the swap policies in turns:
                    thrash, starvation, priority across models (``--scenario model-pool``)
``model_pool_shifting`` the same scenario's shifting demand: the hot model changes phase
                    by phase, against a fleet started with the right one
``model_pool_real`` the same scenario's real-model case: one CPU worker swapping between
                    three real models, its texts against each alone, loads, memory
``adapters``        LoRA adapters mixed in batches, and swapping past ``--max-loras``,
                    against the base model alone (static or vLLM)
``batch``           a batch file of a million lines run in waves: Redis' peak memory,
                    lines/s against plain requests, the status read's p50
``batch_faults``    the same scenario's company: another tenant's requests beside the
                    big batch, and a 200,000-line batch through three kills (-9)
``gateway``         ``genq serve`` against the client library, per request and streamed
``flood``           one tenant's thousands of waiting chats at one ``genq serve`` against
                    another's single requests and ``/health``; connections and memory
``attacks``         one tenant's attacks on a gateway's defaults (junk, uploads, huge bodies,
                    tool schemas, malformed input) beside another's chats; Redis' peak
``vllm_compare``    vLLM alone against vLLM through the queue
``tenants``         fair share: a flood against a trickle, weights, tokens per minute
``tenant_fleet``    one tenants case's fleet, and the counts the cases share
``tenant_weights``  weights 3:1 over the fleet; 1, 1, 2, 4, 8 with a worker killed
``structured``      a JSON schema against free text, per engine; compile costs
``embed``           embeddings through the queue against sentence-transformers' ``encode``
``embed_priority``  single high queries beside a low indexing job: latency and the job's speed
``embed_peer``      genq serve against another embedding server (Infinity), the openai SDK
``embed_vllm``      vLLM's pooling runner through the queue against vLLM alone
``webhooks``        webhook delivery latency and deliveries per second
``dashboard``       a dashboard refresh's cost in Redis, and its render time, on a busy queue
``prefix``          placement by prefix on and off: echo workers with simulated prefix caches
``prefix_engine``   the same on vLLM (smollm2-135m): shuffled shared prefixes, chats through
                    ``genq serve`` (``--scenario prefix-vllm``)
==================  =========================================================================
"""

SCENARIO_HELP = (
    "priority: preemption and time slices on and off (cases: high behind "
    "running low work, a low backlog's speed, short requests beside long ones; --engine vllm "
    "adds the vLLM engine); aging: waits per priority under a low-priority backlog; fleet: "
    "simulated GPU workers (echo, mixed speeds) under bursts and Poisson arrivals, against "
    "the ideal; "
    "gateway: genq serve's added latency and requests/s against the Python client; tenants: "
    "a flood beside a trickle, service gaps, weights and a quota, fair against first-come; "
    "structured: tokens/s with a JSON schema against free, per engine, and compile costs; "
    "webhooks: delivery latency after a final state, and deliveries/s of one gateway; "
    "dashboard: a refresh's cost in Redis and the overview's render time, on a busy queue; "
    "prefix: echo workers with simulated prefix caches, placement by prefix on and off; "
    "prefix-vllm: the same on vLLM (smollm2-135m), with chats through genq serve; "
    "flood: one tenant's thousands of waiting chats beside another's; attacks: one tenant's "
    "attacks on a gateway's defaults beside another's chats; models: two models on one queue "
    "and one gateway, mixed requests, a worker killed: no wrong-model answers; adapters: "
    "LoRA adapters mixed in batches against the base model (--engine vllm: on vLLM); embed: "
    "embeddings through the queue against sentence-transformers in-process, and with 40% "
    "repeats; embed-priority: single high queries beside a low indexing job; embed-peer: "
    "genq serve against another embedding server (--peer-url), the openai SDK on both; "
    "embed-vllm: vLLM's pooling runner through the queue against vLLM alone"
)
"""``genq bench --scenario``'s help: what each scenario measures (the modules above)."""
