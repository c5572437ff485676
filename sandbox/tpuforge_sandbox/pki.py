"""The sandbox's certificates and keys: a CA, the apiserver's and the admission webhooks' serving
certificates, the ServiceAccount signing key pair and the static admin token. Created once per state directory."""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Names a client may use for the apiserver: loopback, and the in-cluster names a pod's tooling may expect.
APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
APISERVER_IPS = ("127.0.0.1", "10.96.0.1")
ADMIN_USER = "tpuforge-admin"


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    @property
    def tokens_csv(self) -> Path:
        return self.dir / "tokens.csv"

    def admin_token(self) -> str:
        return self.tokens_csv.read_text().split(",", 1)[0]

    def ensure(self) -> None:
        """Create whatever is missing; never replaces what exists (a running cluster trusts it)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        if not (self.ca_crt.exists() and self.ca_key.exists()):
            key = _rsa_key()
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpuforge-sandbox-ca")])
            cert = (
                _builder(name, name, key)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(
                    x509.KeyUsage(
                        digital_signature=True,
                        key_cert_sign=True,
                        crl_sign=True,
                        content_commitment=False,
                        key_encipherment=False,
                        data_encipherment=False,
                        key_agreement=False,
                        encipher_only=False,
                        decipher_only=False,
                    ),
                    critical=True,
                )
                .sign(key, hashes.SHA256())
            )
            _write_key(self.ca_key, key)
            self.ca_crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
            # A new CA invalidates the serving certificates signed by an old one.
            self.apiserver_crt.unlink(missing_ok=True)
            for crt in self.dir.glob("*-webhook/tls.crt"):
                crt.unlink()
        if not (self.apiserver_crt.exists() and self.apiserver_key.exists()):
            self._serving_cert("kube-apiserver", APISERVER_DNS, APISERVER_IPS, self.apiserver_crt, self.apiserver_key)
        if not (self.sa_key.exists() and self.sa_pub.exists()):
            key = _rsa_key()
            _write_key(self.sa_key, key)
            self.sa_pub.write_bytes(
                key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )
        if not self.tokens_csv.exists():
            # token,user,uid,"group": the admin is in system:masters, which RBAC lets do anything.
            self.tokens_csv.write_text(f'{secrets.token_hex(24)},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
            self.tokens_csv.chmod(0o600)

    def webhook_cert_dir(self, name: str) -> Path:
        """`<name>-webhook/` with tls.crt and tls.key (as controller-runtime reads them) for a webhook server
        on 127.0.0.1, signed by the sandbox's CA; made once. ensure() first."""
        out = self.dir / f"{name}-webhook"
        crt, key = out / "tls.crt", out / "tls.key"
        if not (crt.exists() and key.exists()):
            out.mkdir(exist_ok=True)
            self._serving_cert(f"{name}-webhook", ("localhost",), ("127.0.0.1",), crt, key)
        return out

    def _serving_cert(self, cn: str, dns: tuple[str, ...], ips: tuple[str, ...], crt: Path, key_path: Path) -> None:
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        assert isinstance(ca_key, rsa.RSAPrivateKey)
        ca = x509.load_pem_x509_certificate(self.ca_crt.read_bytes())
        key = _rsa_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cert = (
            _builder(subject, ca.subject, key)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(key_path, key)
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _builder(subject: x509.Name, issuer: x509.Name, key: rsa.RSAPrivateKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=3650))
    )


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
