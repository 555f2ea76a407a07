import logging

import pytest

from trident.errors import TritonError
from trident.observability.logs import LogSettings, TritonFormatter


def _record(level=logging.INFO, msg="hello"):
    return logging.LogRecord("trident.x", level, "/a/b/repository.py", 12, msg, None, None)


def test_default_and_iso_formats():
    line = TritonFormatter("default").format(_record())
    assert line.startswith("I") and "repository.py:12] hello" in line
    iso = TritonFormatter("ISO8601").format(_record(logging.ERROR))
    assert iso[4] == "-" and iso[10] == "T" and " E " in iso and iso.endswith("repository.py:12] hello")


def test_settings_update_and_validation():
    s = LogSettings()
    assert set(s.as_dict()) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    out = s.update({"log_info": False, "log_verbose_level": 2, "log_format": "ISO8601"})
    assert out["log_info"] is False and out["log_verbose_level"] == 2 and out["log_format"] == "ISO8601"
    assert s.update({"log_format": "json"})["log_format"] == "json"
    for bad in ({"log_info": "yes"}, {"log_verbose_level": -1}, {"log_format": "JSON"}, {"log_format": "xml"},
                {"x": 1}):
        with pytest.raises(TritonError) as e:
            s.update(bad)
        assert e.value.code.name == "INVALID_ARG"
    with pytest.raises(TritonError) as e:
        s.update({"log_file": "/tmp/x"})
    assert e.value.code.name == "UNSUPPORTED"


def test_filter_follows_live_settings(tmp_path):
    s = LogSettings(log_file=str(tmp_path / "log.txt"))
    s.install()
    logger = logging.getLogger("trident.test")
    logger.info("first")
    s.update({"log_info": False})
    logger.info("second")
    logger.error("third")
    logger.log(5, "verbose", extra={"verbose": 1})
    s.update({"log_verbose_level": 1})
    logger.log(5, "verbose-shown", extra={"verbose": 1})
    text = (tmp_path / "log.txt").read_text()
    assert "first" in text and "second" not in text and "third" in text
    assert "verbose-shown" in text and "] verbose\n" not in text
