"""The fuzzer's short campaign (tests/fuzz/kmlfuzz.py): a few hundred
seeded cases, every one through the real CLI, and not one defect.  `make
fuzz` runs the long campaign."""
import os

import kmlfuzz

CASES = int(os.environ.get("KMLC_FUZZ_CASES", "240"))


def test_short_campaign(tmp_path):
    results = kmlfuzz.campaign(seed=1, cases=list(range(CASES)), work=tmp_path, jobs=2,
                               budget=1800)
    print("\n" + kmlfuzz.table(results))
    assert len(results) == CASES, "the time budget ran out"
    bad = kmlfuzz.defects(results)
    assert not bad, "\n".join(f"case {r['index']} [{r['cls']}] {r['outcome']}: {r['note']}\n"
                              f"  {r['detail'][:500]}" for r in bad)
    # both outcomes are exercised in every class (a fuzzer that only ever
    # meets refusals, or only acceptances, proves little)
    for cls in kmlfuzz.CLASSES:
        outcomes = {r["outcome"] for r in results if r["cls"] == cls}
        assert outcomes == {"refused", "accepted"}, (cls, outcomes)
