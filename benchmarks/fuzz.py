"""Fuzz the request path at scale: ``python -m benchmarks.fuzz [--cases 10000]``.

The same generators and checks as ``tests/proxy/test_fuzz.py`` (tests/support/fuzzing.py), with
fresh random cases each run: requests, tool schemas, model answers, SSE chunk boundaries, each
sent beside a concurrent neighbour. Prints the outcome mix, crashes (0 expected), proxy-made 5xx
for client input (0 expected) and answers delivered to the wrong client (0 expected). Three
tenants (client keys) reuse each other's episode ids: half the cases name one from a shared pool,
and every case's neighbour is a sentinel tenant naming the same id; its episode must stay unspent
(cross-tenant effects, 0 expected). Every request presents its key in one of the credential forms
authentication accepts (``Authorization: Bearer`` or ``x-api-key``, drawn per request). The run
is made twice, episodes in memory and in a ``redis-server`` the benchmark starts (it fails, never
skips, without one: ``--store memory`` runs the first alone); the figures go to
``benchmarks/results/fuzz.json`` as well as the printed ``fuzz.txt``.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import time
from typing import Any

from hypothesis import HealthCheck, given, settings

from benchmarks.support.results import run_recorded, write_json
from tests.support import fuzzing
from tests.support.processes import redis_server

QUESTION = (
    "Does any generated request make the proxy answer other than a clean status, or cross clients?"
)


def _run_mode(cases: int, episode_store: str) -> dict[str, Any]:
    """``cases`` generated cases against one proxy whose episodes live in ``episode_store``."""
    outcomes: collections.Counter[tuple[int, str]] = collections.Counter()
    failures: list[str] = []
    crossed: list[str] = []
    shared = collections.Counter[bool]()
    forms = collections.Counter[str]()
    check, isolated = fuzzing._check, fuzzing._check_isolated

    def counting_check(tag: str, response: object) -> None:
        status = getattr(response, "status_code", 0)
        headers = getattr(response, "headers", {})
        outcomes[(status, headers.get("x-repairproxy-tool-errors", "(stream)") or "valid")] += 1
        try:
            check(tag, response)  # type: ignore[arg-type]
        except AssertionError as exc:
            failures.append(str(exc)[:200])

    def counting_isolated(tag: str, response: object) -> None:
        try:
            isolated(tag, response)  # type: ignore[arg-type]
        except AssertionError as exc:
            crossed.append(str(exc)[:200])

    fuzzing._check, fuzzing._check_isolated = counting_check, counting_isolated
    started = time.perf_counter()
    try:
        with fuzzing.fuzz_rig(episode_store) as rig:

            @settings(max_examples=cases, deadline=None, suppress_health_check=list(HealthCheck))
            @given(case=fuzzing.cases())
            def run(case: fuzzing.Case) -> None:
                shared[case.episode is not None] += 1
                forms[case.form] += 1
                rig.run(case)

            run()
    finally:
        fuzzing._check, fuzzing._check_isolated = check, isolated
    elapsed = time.perf_counter() - started
    mode = "redis" if episode_store != "memory" else "memory"
    total = sum(outcomes.values())
    print(
        f"[{mode}] {cases} generated cases, {total} exchanges (with neighbours) in {elapsed:.0f} s"
    )
    for (status, channels), count in outcomes.most_common(20):
        print(f"{count:>7}  {status}  {channels}")
    print(f"[{mode}] check failures (wrong client, proxy-made 5xx, no answer): {len(failures)}")
    for failure in failures[:10]:
        print("  ", failure)
    named = shared[True] / max(1, sum(shared.values()))
    print(
        f"[{mode}] tenants: {len(fuzzing.KEYS)} fuzzed + 1 sentinel; {named:.0%} of cases named a "
        f"shared episode id ({len(fuzzing.EPISODE_POOL)} ids, every one also named by the "
        f"sentinel); credential forms per request: {dict(forms)} (the sentinel cycles them)"
    )
    print(f"[{mode}] cross-tenant effects (sentinel episode spent or refused): {len(crossed)}")
    for failure in crossed[:10]:
        print("  ", failure)
    return {
        "cases": cases,
        "exchanges": total,
        "seconds": round(elapsed, 1),
        "wrong_client_or_5xx": len(failures),
        "cross_tenant_effects": len(crossed),
        "shared_episode_share": round(named, 3),
        "credential_forms": dict(forms),
    }


def main(argv: list[str] | None = None, *, record: bool = False) -> int:
    """Run and print; ``record`` (the command, not a test) also writes ``fuzz.json``."""
    parser = argparse.ArgumentParser(
        description=f"{QUESTION}\n\n{__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", type=int, default=10_000, help="generated cases per store")
    parser.add_argument(
        "--store",
        choices=("both", "memory", "redis"),
        default="both",
        help="where the proxy keeps episodes: in process, in a redis-server it starts, or both",
    )
    args = parser.parse_args(argv)
    stores = ("memory", "redis") if args.store == "both" else (args.store,)
    if "redis" in stores and shutil.which("redis-server") is None:
        print("redis-server is not installed (apt-get install redis-server): the Redis run fails")
        return 1
    figures: dict[str, Any] = {"question": QUESTION, "forms": list(fuzzing.FORMS)}
    for store in stores:
        if store == "memory":
            figures["memory"] = _run_mode(args.cases, "memory")
            continue
        with redis_server() as server:
            figures["redis"] = _run_mode(args.cases, server.url)
    print("the proxy answered /healthz after each run (else the rig would have raised)")
    bad = sum(
        figures[s]["wrong_client_or_5xx"] + figures[s]["cross_tenant_effects"] for s in stores
    )
    if record:
        command = " ".join(["python -m benchmarks.fuzz", *(argv or [])])
        print(f"(figures written to {write_json('fuzz', figures, command=command)})")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(run_recorded("fuzz", lambda argv: main(argv, record=True)))
