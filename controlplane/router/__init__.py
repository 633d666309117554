"""The live LLM-aware router: an OpenAI-compatible proxy that picks an endpoint per request with the
simulator's scoring code (routing.router), holds requests in a gateway queue (routing.flow) while
the pool is saturated or scaled to zero, and exports llm-d-named metrics for autoscaling.

    cfg = load_router_config("examples/router.yaml")   # routing.config (a scenario reads it too)
    app = build_router_app(cfg, static(["http://127.0.0.1:8001", "http://127.0.0.1:8002"]))
    HttpServer(app.handle, app.startup, app.shutdown, "127.0.0.1", 8080).run()   # router.httpserver
    # or in a background thread: with RouterServer(app) as router: router.url
"""
