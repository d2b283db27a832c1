"""deploy/grafana-dashboard.json asks only for series the server exports: each metric its
queries name is one a live server's ``/metrics`` declares (a counter as ``_total``, a histogram
as ``_bucket``, ``_count``, ``_sum``), the drift panel among them, alarmed at 0.9."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from tests.service.conftest import Server

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana-dashboard.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported(server: Server) -> set[str]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    names = set()
    for name, kind in re.findall(r"^# TYPE (attrserve_\w+) (\w+)$", text, re.M):
        base = name.removesuffix("_total")
        names |= {base + s for s in SUFFIXES.get(kind, ("",))}
    return names


def test_every_query_names_an_exported_series(server: Server) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    series = exported(server)
    assert "attrserve_attribution_ndcg" in series  # the monitors' gauge, declared at start
    asked = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            asked |= set(re.findall(r"attrserve_\w+", target["expr"]))
    assert asked and asked <= series, asked - series
    drift = next(p for p in dashboard["panels"] if "drift" in p["title"].lower())
    steps = drift["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 0.9]
    assert {p["id"] for p in dashboard["panels"]} == set(range(1, len(dashboard["panels"]) + 1))
