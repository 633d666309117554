"""`slopilot async --engine-priority P`: each request goes to the router with `priority: P` unless
it sets its own (the engines' background class), and without the option the body is sent as given."""

import asyncio
import json

import httpx

from controlplane.batch.queue_consumer import QueueConsumer


def sent_bodies(engine_priority, bodies):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"object": "text_completion"})

    async def go():
        c = QueueConsumer("redis://127.0.0.1:1/0", "s", "http://router", engine_priority=engine_priority)
        await c.http.aclose()
        c.http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        for i, body in enumerate(bodies):
            line = json.loads(await c.answer(f"r{i}", {"reply_key": "k", "body": json.dumps(body)}))
            assert line["response"]["status_code"] == 200
        await c.http.aclose()
        await c.redis.aclose()
    asyncio.run(go())
    return seen


def test_engine_priority_is_added_unless_the_request_sets_one():
    bodies = [{"model": "m", "prompt": "a"}, {"model": "m", "prompt": "b", "priority": 5}]
    assert [b.get("priority") for b in sent_bodies(1, bodies)] == [1, 5]
    assert [b.get("priority") for b in sent_bodies(None, bodies)] == [None, 5]
