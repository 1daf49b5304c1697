"""Fuzz the request path at scale: ``python -m benchmarks.fuzz [--cases 10000]``.

The same generators and checks as ``tests/proxy/test_fuzz.py`` (tests/support/fuzzing.py), with
fresh random cases each run: requests, tool schemas, model answers, SSE chunk boundaries, each
sent beside a concurrent neighbour. Prints the outcome mix, crashes (0 expected), proxy-made 5xx
for client input (0 expected) and answers delivered to the wrong client (0 expected). Three
tenants (client keys) reuse each other's episode ids: half the cases name one from a shared pool,
and every case's neighbour is a sentinel tenant naming the same id; its episode must stay unspent
(cross-tenant effects, 0 expected).
"""

from __future__ import annotations

import argparse
import collections
import time

from hypothesis import HealthCheck, given, settings

from benchmarks.support.results import run_recorded
from tests.support import fuzzing

QUESTION = (
    "Does any generated request make the proxy answer other than a clean status, or cross clients?"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=f"{QUESTION}\n\n{__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", type=int, default=10_000)
    args = parser.parse_args(argv)
    outcomes: collections.Counter[tuple[int, str]] = collections.Counter()
    failures: list[str] = []
    check = fuzzing._check

    def counting_check(tag: str, response: object) -> None:
        status = getattr(response, "status_code", 0)
        headers = getattr(response, "headers", {})
        outcomes[(status, headers.get("x-repairproxy-tool-errors", "(stream)") or "valid")] += 1
        try:
            check(tag, response)  # type: ignore[arg-type]
        except AssertionError as exc:
            failures.append(str(exc)[:200])

    isolated = fuzzing._check_isolated
    crossed: list[str] = []
    shared = collections.Counter[bool]()

    def counting_isolated(tag: str, response: object) -> None:
        try:
            isolated(tag, response)  # type: ignore[arg-type]
        except AssertionError as exc:
            crossed.append(str(exc)[:200])

    fuzzing._check = counting_check
    fuzzing._check_isolated = counting_isolated
    started = time.perf_counter()
    with fuzzing.fuzz_rig() as rig:

        @settings(max_examples=args.cases, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=fuzzing.cases())
        def run(case: fuzzing.Case) -> None:
            shared[case.episode is not None] += 1
            rig.run(case)

        run()
    elapsed = time.perf_counter() - started
    total = sum(outcomes.values())
    print(f"{args.cases} generated cases, {total} exchanges (with neighbours) in {elapsed:.0f} s")
    for (status, channels), count in outcomes.most_common(20):
        print(f"{count:>7}  {status}  {channels}")
    print(f"check failures (wrong client, proxy-made 5xx, no answer): {len(failures)}")
    for failure in failures[:10]:
        print("  ", failure)
    named = shared[True] / max(1, sum(shared.values()))
    print(
        f"tenants: {len(fuzzing.KEYS)} fuzzed + 1 sentinel; {named:.0%} of cases named a shared "
        f"episode id ({len(fuzzing.EPISODE_POOL)} ids, every one also named by the sentinel)"
    )
    print(f"cross-tenant effects (sentinel episode spent or refused): {len(crossed)}")
    for failure in crossed[:10]:
        print("  ", failure)
    print("the proxy answered /healthz after the run (else the rig would have raised)")


if __name__ == "__main__":
    raise SystemExit(run_recorded("fuzz", main))
