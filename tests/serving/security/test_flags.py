"""The security flags check their files and numbers before the server starts."""
from __future__ import annotations


def test_bad_security_files_stop_the_server_with_a_clear_error(model, tmp_path, capsys):
    from modelyard.cli import main

    (tmp_path / "ssl.config").write_text('server_key: "not a key"\nserver_cert: "not a cert"\n')
    (tmp_path / "tokens").write_text("short predict\n")
    (tmp_path / "scopes").write_text("a-long-enough-token-0123 predict,delete\n")
    cases = {
        ("--ssl_config_file", str(tmp_path / "ssl.config")): "not usable PEM",
        ("--ssl_config_file", str(tmp_path / "missing")): "Cannot read --ssl_config_file",
        ("--auth_token_file", str(tmp_path / "tokens")): "at least 16 characters",
        ("--auth_token_file", str(tmp_path / "scopes")): "unknown scope delete",
        ("--auth_open_health",): "only apply with --auth_token_file",
        ("--max_connections", "-1"): "cannot be negative",
    }
    for flags, message in cases.items():
        status = main(["serve", "--model_name", "m", "--model_base_path", str(model), *flags])
        assert status == 2
        assert message in capsys.readouterr().err, flags
