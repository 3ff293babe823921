"""The server-side protocol layer shared by every arctic.v1 server.

It owns routing, chunk groups, idempotency, sequencing, polling and capabilities over small
storage interfaces; a server implements only its business logic as a `Servicer` (the generated
`arctic_servers._generated.servicer.ServicerBase`).
"""
