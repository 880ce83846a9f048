"""Module signing (`kmlc build OUTDIR --sign KEY CERT`), as Kbuild's
modules_sign signs: the kernel tree's scripts/sign-file, its hash.

The oracle is openssl, not kmlc: the appended PKCS#7 signature verifies
against the module's bytes and the certificate with `openssl cms -verify`,
and fails once a byte of the module changes; modinfo names the signer.
Signing twice leaves one signature.  A key that is not the certificate's,
or a missing key, is refused in one line with no traceback, and the
signed module stays as it was.
"""
import subprocess

import pytest

from conftest import kmlc_cli, mlp_model
from kmlc.api import compile as kcompile

MAGIC = b"~Module signature appended~\n"


def keypair(d, cn):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    d / f"{cn}.key", "-out", d / f"{cn}.pem", "-days", "2", "-subj",
                    f"/CN={cn}", "-addext", "extendedKeyUsage=codeSigning"],
                   check=True, capture_output=True)
    return d / f"{cn}.key", d / f"{cn}.pem"


def split(ko_bytes):
    """[module][PKCS#7 DER][12-byte struct module_signature][magic]."""
    assert ko_bytes.endswith(MAGIC) and ko_bytes.count(MAGIC) == 1
    trailer = ko_bytes[-len(MAGIC) - 12:-len(MAGIC)]
    algo, hash_, id_type, signer_len, key_id_len = trailer[:5]
    sig_len = int.from_bytes(trailer[8:12], "big")
    assert (algo, hash_, id_type, signer_len, key_id_len) == (0, 0, 2, 0, 0)  # PKEY_ID_PKCS7
    end = len(ko_bytes) - len(MAGIC) - 12
    return ko_bytes[:end - sig_len], ko_bytes[end - sig_len:end]


def verifies(tmp_path, body, sig, cert):
    (tmp_path / "body").write_bytes(body)
    (tmp_path / "sig.p7").write_bytes(sig)
    return subprocess.run(["openssl", "cms", "-verify", "-binary", "-inform", "DER", "-in",
                           tmp_path / "sig.p7", "-content", tmp_path / "body", "-certfile", cert,
                           "-nointern", "-noverify", "-out", "/dev/null"],
                          capture_output=True).returncode == 0


@pytest.mark.kernel
def test_a_signed_module_verifies_and_a_tampered_one_does_not(tmp_path):
    key, cert = keypair(tmp_path, "kmlc-test-signer")
    other_key, _ = keypair(tmp_path, "someone-else")
    kcompile(mlp_model([4, 8, 2]), tmp_path / "o", name="signed", targets="kernel")
    res = kmlc_cli("build", tmp_path / "o", "--sign", key, cert)
    assert res.returncode == 0 and "signed sha256" in res.stdout, res.stderr
    ko = tmp_path / "o" / "kernel" / "kml_signed.ko"
    body, sig = split(ko.read_bytes())
    assert verifies(tmp_path, body, sig, cert)
    tampered = bytearray(body)
    tampered[len(body) // 2] ^= 1
    assert not verifies(tmp_path, bytes(tampered), sig, cert)
    info = subprocess.run(["/sbin/modinfo", ko], capture_output=True, text=True).stdout
    assert "signer:         kmlc-test-signer" in info and "sig_hashalgo:   sha256" in info, info
    # again: one signature, the module's bytes unchanged
    assert kmlc_cli("build", tmp_path / "o", "--sign", key, cert).returncode == 0
    assert split(ko.read_bytes())[0] == body
    for args, why in (((other_key, cert), "signing kml_signed.ko with"),
                      ((tmp_path / "nope.key", cert), "no such signing key")):
        res = kmlc_cli("build", tmp_path / "o", "--sign", *args)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert why in res.stderr and res.stderr.strip().count("\n") == 0, res.stderr
        assert split(ko.read_bytes())[0] == body      # the signed module left as it was
        assert not list(ko.parent.glob("*.signing"))
