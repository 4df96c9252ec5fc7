import logging

from sparkd.logfmt import kv, setup_logging, stderr_is_journal


def test_kv_quotes_what_needs_quoting():
    assert kv("start", service="llm", argv="sleep 100", empty="", skipped=None, n=3) == \
        'event=start service=llm argv="sleep 100" empty="" n=3'
    assert kv("x", msg='a "b"\nc') == 'event=x msg="a \\"b\\"\\nc"'


def test_journal_prefix_only_when_stderr_is_the_journal(tmp_path, capfd):
    with open(tmp_path / "f", "w") as f:
        import os
        st = os.fstat(f.fileno())
        assert stderr_is_journal(f"{st.st_dev}:{st.st_ino}", f)
        assert not stderr_is_journal("1:2", f)
        assert not stderr_is_journal(None, f)
    setup_logging(journal=True)
    logging.getLogger("t").warning("%s", kv("boom", a=1))
    assert capfd.readouterr().err == "<4>level=warning event=boom a=1\n"
