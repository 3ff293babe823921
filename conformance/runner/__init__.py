"""The arctic.v1 conformance runner: `python -m conformance --target URL`.

Cases are data (`conformance/cases/*.yaml`, documented in conformance/cases/README.md); the runner
reads the server's capabilities, runs the cases that apply over HTTP or gRPC, and reports each
case's outcome and first difference (console table, JUnit XML, JSON).

Independence: the runner speaks the protocol with `requests`, `http.client` and plain `grpc`,
the DSSST1 codec (`dssst1`) and the public spec model (`arctic_sdk.spec`: the generated messages
and method table) only — never the SDK's client, transports, core, errors or config, and never
the server runtime — so a bug shared by our SDK and our servers still shows.
"""

from __future__ import annotations

from .cli import main, run_suite, select
from .engine import CaseResult
from .model import Case, load_cases
from .report import Report
from .session import RunConfig

__all__ = ["Case", "CaseResult", "Report", "RunConfig", "load_cases", "main", "run_suite", "select"]
