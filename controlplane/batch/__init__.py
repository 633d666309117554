"""The OpenAI Batch API on the router: files and batches kept in SQLite under the router's state dir,
each batch's lines dispatched through the gateway's lowest-priority (batch) band.

    store.py     the SQLite store (WAL): files, batches, one row per input line with its result
    lines.py     input-line validation and the output/error line shapes (OpenAI's)
    files_api.py /v1/files: upload (multipart, purpose batch, JSONL), list, get, content, delete
    batches_api.py /v1/batches: create, get, list, cancel
    runner.py    the dispatcher: earliest deadline first, through the gate, results written before they
                 count; expiry, cancellation, finalizing into output and error files; resume on start
    metrics.py   the batch backlog (requests, tokens) and deadline gauges on the router's /metrics
"""
