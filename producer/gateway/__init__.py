"""``genq serve``: an OpenAI-compatible HTTP gateway in front of one queue.

Stateless (every request's state lives in Redis), so any number of replicas can run behind a
load balancer. Built on FastAPI/Starlette (ASGI, served by uvicorn) and redis.asyncio.

=================  ===========================================================================
module             what it holds
=================  ===========================================================================
``settings``       ``GatewaySettings``: host, port, keys, limits (flags with env twins)
``app``            ``create_app``: the ASGI app, its clients, the API-key check
``openai_errors``  genq's errors as OpenAI error JSON with the status codes the SDKs map
``fleet``          which models the queue's live workers serve (``GET /v1/models``)
``completions``    ``POST /v1/completions`` and ``/v1/chat/completions``, streaming as SSE
``responses_routes``  ``/v1/responses``: create (background, stream), retrieve, cancel,
                   delete, input items (records in Redis; shapes in ``producer.responses``)
``webhook_delivery``  the queue's webhook events delivered, signed, retried (any gateway)
``files``          ``/v1/files``: batch input files in Redis; batch output files rendered
``batch_routes``   ``/v1/batches``: create, retrieve, list, cancel (on ``producer.batches``)
``dashboard_routes``  ``/dashboard``: the page (``dashboard/``: its HTML, script, styles and
                   the vendored chart library, uPlot) and the JSON it polls; admin keys only
=================  ===========================================================================
"""
