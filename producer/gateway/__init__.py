"""``genq serve``: an OpenAI-compatible HTTP gateway in front of one queue, with what only it
and the operator's commands use: OpenAI's shapes, batches, dead letters, webhooks, the dashboard.

Stateless (every request's state lives in Redis), so any number of replicas can run behind a
load balancer. Built on FastAPI/Starlette (ASGI, served by uvicorn) and redis.asyncio.

=================  ===========================================================================
module             what it holds
=================  ===========================================================================
``settings``       ``GatewaySettings``: host, port, keys, limits (flags with env twins)
``app``            ``create_app``: the ASGI app, its clients, the API-key check
``context``        ``Gateway`` (what every route shares) and ``Caller`` (the tenant an API
                   key stands for, or an admin)
``openai_errors``  genq's errors as OpenAI error JSON with the status codes the SDKs map
``fleet``          which models the queue's live workers serve (``GET /v1/models``)
``result_hub``     ``ResultHub``: every waiting completion's and stream's events, read by a
                   few shared connections (one per 500 waiting requests)
``submitter``      ``Submitter``: the submissions of one turn of the event loop sent together,
                   one SUBMIT call per tenant
``guards``         ``Guards``: cross-site writes, non-JSON bodies and (with no keys) foreign
                   host names refused before any route runs
``body_limit``     ``BodyLimit``: request bodies bounded as their bytes arrive (413)
``quotas``         ``Quotas``: what each tenant keeps (files and their bytes, batches, stored
                   responses), claimed atomically, given back on delete
``redis_room``     ``RedisRoom``: batches refused (507) while Redis' memory would pass its
                   share of maxmemory, keeping room for requests
``in_flight``      ``InFlight``: requests in flight per tenant and in all, and the limits
                   past which the gateway answers 429 (pure)
``completions``    ``POST /v1/completions`` and ``/v1/chat/completions``, streaming as SSE
``embeddings``     ``POST /v1/embeddings``: float or base64 vectors (the stored string as
                   is); ``embedded``, the one way the gateway embeds
``scores``         ``/v1/rerank`` and ``/v1/score``: cosines of an embedding model's vectors
``responses_routes``  ``/v1/responses``: create (background, stream), retrieve, cancel,
                   delete, input items (records in Redis; shapes in ``responses``)
``webhook_delivery``  the queue's webhook events delivered, signed, retried (any gateway)
``files``          ``/v1/files``: batch input files (bytes in the file store, records in
                   Redis); batch output files rendered
``upload_stream``  ``UploadStream``: an upload's multipart body read as it arrives, its file
                   handed on chunk by chunk (never held whole, never spooled)
``batch_routes``   ``/v1/batches``: create, retrieve, list, cancel (on ``batches``)
``batch_runner``   ``BatchRunner``: the rounds of the queue's running batches, run by every
                   gateway while it serves (one process a batch at a time: its lease)
``dashboard_routes``  ``/dashboard``: the page (``dashboard/``: its HTML, script, styles and
                   the vendored chart library, uPlot) and the JSON it polls; admin keys only
=================  ===========================================================================

The modules below import no web framework: ``genq batch``, ``genq dlq`` and ``genq webhooks``
use them too.

======================  ======================================================================
module                  what it holds
======================  ======================================================================
``responses``           ``/v1/responses`` objects: shapes and their states (pure)
``batch_lines``         OpenAI Batch lines and completion bodies into requests, results
                        into output lines (pure)
``completion_bodies``   a result as OpenAI's completion or chat completion body (pure)
``embedding_bodies``    OpenAI's embeddings body into a request, a result into its
                        response body (pure)
``structured_outputs``  the fields clients constrain output with (``response_format``,
                        vLLM's ``structured_outputs``, ``guided_*``) as one
                        ``response_format`` (pure)
``batches``             batches in Redis: submit, status as OpenAI's Batch object, cancel,
                        output files, waiting
``batch_views``         a batch as read from Redis: its record's counters (a status in
                        constant time) or its requests' states
``batch_waves``         a batch file of any size run in waves: fed as the queue drains,
                        written out to the file store as its requests end
``wave_files``          a local file copied in as a batch, rounds run until a state, its
                        output parts read back (``genq batch``)
``file_store``          ``FileStore``: where batch files' bytes are, a directory or an object
                        store by URL (obstore): atomic writes, streamed reads, lines from any
                        offset, one clear error when it is full or away
``repeated_ids``        the lines of an upload that repeat a ``custom_id``, found on the
                        upload's pass in ~12 bytes a line (pure)
``dead_letters``        the dead-letter stream, for people: list, retry, purge
``webhook_letters``     the webhook deliveries that gave up: list, retry
======================  ======================================================================
"""
