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


SIG_SCRIPT = """
fail() { echo "$*"; exit 1; }
[ "$(cat /sys/module/module/parameters/sig_enforce)" = Y ] || fail "signatures not enforced"
rmmod $KML_MODULE || fail "rmmod"
for m in unsigned other-key tampered; do
    if insmod /lib/kmlc/refuse/$m.ko 2>/tmp/err; then fail "$m loaded"; fi
    echo "$m refused: $(cat /tmp/err)"
done
dmesg | grep -q "Loading of unsigned module is rejected" || fail "no unsigned line"
dmesg | grep -q "Loading of module with unavailable key is rejected" || fail "no key line"
insmod /lib/kmlc/$KML_MODULE.ko || fail "the signed module did not load again"
"""


@pytest.mark.kernel
def test_a_signature_enforcing_kernel_loads_signed_modules_only(tmp_path):
    """The debug kernel kmlc builds has CONFIG_MODULE_SIG_FORCE and the key
    its build made in its built-in keyring.  qemu-test signs the model's
    module with that key, and it loads and passes its self-test; the same
    module unsigned, signed with another key, or signed and then changed
    by one byte is refused, and the kernel's log says why (the oracle is
    the kernel's own signature check)."""
    from kmlc.targets import qemu
    from kmlc.targets.kernel import build_module, kernel_config, sign_module

    k = qemu.resolve("debug")
    assert kernel_config(k.kdir).get("CONFIG_MODULE_SIG_FORCE") == "y"
    out = tmp_path / "o"
    kcompile(mlp_model([4, 8, 2]), out, name="sigforce", targets="kernel")
    ko = build_module(out / "kernel", kdir=k.kdir)
    refuse = tmp_path / "refuse"
    refuse.mkdir()
    assert not ko.read_bytes().endswith(MAGIC)
    (refuse / "unsigned.ko").write_bytes(ko.read_bytes())
    other = refuse / "other-key.ko"
    other.write_bytes(ko.read_bytes())
    sign_module(other, *keypair(tmp_path, "someone-else"), k.kdir)
    tampered = refuse / "tampered.ko"
    tampered.write_bytes(ko.read_bytes())
    sign_module(tampered, k.kdir / "certs" / "signing_key.pem",
                k.kdir / "certs" / "signing_key.x509", k.kdir)
    data = bytearray(tampered.read_bytes())
    i = data.index(b"license=GPL")
    data[i + 8:i + 11] = b"gpl"               # one string of .modinfo, same length
    tampered.write_bytes(bytes(data))
    script = tmp_path / "sig.sh"
    script.write_text(SIG_SCRIPT)
    res = qemu.run([out], kernel="debug", script=script,
                   files={f"lib/kmlc/refuse/{p.name}": p for p in refuse.iterdir()})
    assert res["ok"], "\n".join(res["lines"])
    assert any(ln.startswith("kml_sigforce: PASS") and "bit-identical" in ln
               for ln in res["lines"]), res["lines"]
    assert split(ko.read_bytes())[0]          # qemu-test signed it (the kernel's key)
    for m in ("unsigned", "other-key", "tampered"):
        assert f"{m} refused" in res["log"], res["log"][-3000:]
