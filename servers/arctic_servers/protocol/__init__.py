"""The transport-neutral protocol core shared by every arctic.v1 server.

It owns auth, input limits, body validation, chunk groups, idempotency, sequencing, request
execution, polling and capabilities over small storage interfaces; a server implements only its
business logic as a servicer (the generated `arctic_servers._generated.servicer.ServicerBase`,
which derives from this room's `ServicerHooks`). It imports only `rules/` and `telemetry/`
(servers/README.md, "Rooms").
"""
