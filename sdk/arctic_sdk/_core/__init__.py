"""The sans-I/O protocol core: request building, retries, polls, chunk groups, error parsing.

Nothing in this package performs I/O. Flows are generators that yield effects (`effects.Send`,
`effects.Sleep`, `effects.Progress`) and receive their results; the transports in
`arctic_sdk.transports` are thin drivers that do the I/O for the sync and the async client.
"""
