"""Reading the suites' results from the debug kernel's log (x86_64 KUnit:
the suites are modules, their KTAP is in dmesg): the counts come from the
KTAP whatever the timestamps in front of it, and a report in the log (a
KASAN splat, a lockdep warning) or a suite module that did not load fails
a run whose every case passed."""
import io

from kmlc.targets.kunit import _summarize, kernel_log

MODEL = {"name": "m", "module": "kml_m", "golden_vectors": 2, "set_forgeries": 1}
# cases: 2 vectors + bad arguments + 3 weight-set cases + 1 forgery = 7
KTAP = ["    # Subtest: kml_m", "    1..7"] + \
    [f"    ok {i} - case{i}" for i in range(1, 8)] + ["ok 1 - kml_m"]


def console(body: list[str], done: bool = True) -> str:
    stamped = [f"[{12 + i * 0.001:12.6f}] {ln}" for i, ln in enumerate(body)]
    tail = ["KMLC-DMESG-END", "KMLC-DONE"] if done else []
    return "\n".join(["KMLC-BOOTED 6.1.0-kmlc-debug", "KMLC-DMESG-BEGIN", *stamped, *tail]) + "\n"


def summarize(text: str) -> dict:
    lines, reports, rc = kernel_log(text)
    return _summarize(lines, rc, [MODEL], io.StringIO(), reports)


def test_timestamped_ktap_counts_every_case():
    res = summarize(console(KTAP))
    assert res["ok"], res["summary"]
    assert res["suites"]["kml_m"] == {"passed": 7, "failed": 0, "skipped": 0}


def test_a_failed_case_fails_the_run():
    body = [ln.replace("ok 3 ", "not ok 3 ") for ln in KTAP]
    res = summarize(console(body))
    assert not res["ok"] and res["suites"]["kml_m"]["failed"] == 1


def test_a_sanitizer_report_fails_a_run_whose_cases_passed():
    for splat in ("BUG: KASAN: slab-out-of-bounds in kml_m_forward+0x2a/0x90",
                  "WARNING: possible circular locking dependency detected",
                  "UBSAN: shift-out-of-bounds in kml_m.c:12:3"):
        res = summarize(console(KTAP[:5] + [splat] + KTAP[5:]))
        assert res["suites"]["kml_m"]["passed"] == 7
        assert not res["ok"] and splat in res["summary"], res["summary"]


def test_a_module_that_did_not_load_fails():
    text = console(KTAP).replace("KMLC-DMESG-BEGIN",
                                 "KMLC-RESULT kml_n FAIL insmod\nKMLC-DMESG-BEGIN")
    res = summarize(text)
    assert not res["ok"] and "kml_n FAIL insmod" in res["summary"], res["summary"]


def test_a_boot_that_did_not_finish_is_an_error_with_the_console_tail():
    import pytest

    from kmlc.errors import KmlcError

    text = console(["Kernel panic - not syncing: Fatal exception"], done=False)
    with pytest.raises(KmlcError) as e:
        summarize(text)
    assert "before running any kmlc suite" in str(e.value)
    assert "Kernel panic" in e.value.details
