"""Helpers for scripts that run under horovodrun."""
import json


def result(rank: int, **values) -> None:
    """Print one RESULT line for the test that launched this script."""
    print("RESULT " + json.dumps({"rank": rank, **values}), flush=True)
