"""The sandbox's certificates and keys: a CA, the apiserver's and the admission webhooks' serving
certificates, the ServiceAccount signing key pair, the static admin token, and for the aggregation layer a
front-proxy CA with the apiserver's proxy client certificate (as kubeadm makes them). Created once per state
directory."""

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
# The name the aggregator's client certificate carries: extension apiservers trust request headers
# (X-Remote-User, X-Remote-Group) only from a client of this name signed by the front-proxy CA.
FRONT_PROXY_CLIENT = "front-proxy-client"


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

    @property
    def front_proxy_ca_crt(self) -> Path:
        return self.dir / "front-proxy-ca.crt"

    @property
    def front_proxy_ca_key(self) -> Path:
        return self.dir / "front-proxy-ca.key"

    @property
    def front_proxy_client_crt(self) -> Path:
        return self.dir / "front-proxy-client.crt"

    @property
    def front_proxy_client_key(self) -> Path:
        return self.dir / "front-proxy-client.key"

    def admin_token(self) -> str:
        return self.tokens_csv.read_text().split(",", 1)[0]

    def ensure(self) -> None:
        """Create whatever is missing; never replaces what exists (a running cluster trusts it)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        if not (self.ca_crt.exists() and self.ca_key.exists()):
            _self_signed_ca("tpuforge-sandbox-ca", self.ca_crt, self.ca_key)
            # A new CA invalidates the serving certificates signed by an old one.
            self.apiserver_crt.unlink(missing_ok=True)
            for crt in self.dir.glob("*-webhook/tls.crt"):
                crt.unlink()
            for crt in self.dir.glob("*-serving/tls.crt"):
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
        if not (self.front_proxy_ca_crt.exists() and self.front_proxy_ca_key.exists()):
            _self_signed_ca("tpuforge-sandbox-front-proxy-ca", self.front_proxy_ca_crt, self.front_proxy_ca_key)
            self.front_proxy_client_crt.unlink(missing_ok=True)
        if not (self.front_proxy_client_crt.exists() and self.front_proxy_client_key.exists()):
            self._leaf(
                FRONT_PROXY_CLIENT,
                (),
                (),
                self.front_proxy_client_crt,
                self.front_proxy_client_key,
                ExtendedKeyUsageOID.CLIENT_AUTH,
                (self.front_proxy_ca_crt, self.front_proxy_ca_key),
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

    def serving_cert_dir(self, name: str, dns: tuple[str, ...]) -> Path:
        """`<name>-serving/` with tls.crt and tls.key for a server on 127.0.0.1 that clients also reach by the
        names `dns` (an aggregated apiserver: `<service>.<namespace>.svc`), signed by the sandbox's CA; made
        once. ensure() first."""
        out = self.dir / f"{name}-serving"
        crt, key = out / "tls.crt", out / "tls.key"
        if not (crt.exists() and key.exists()):
            out.mkdir(exist_ok=True)
            self._serving_cert(name, ("localhost", *dns), ("127.0.0.1",), crt, key)
        return out

    def _serving_cert(self, cn: str, dns: tuple[str, ...], ips: tuple[str, ...], crt: Path, key_path: Path) -> None:
        self._leaf(cn, dns, ips, crt, key_path, ExtendedKeyUsageOID.SERVER_AUTH, (self.ca_crt, self.ca_key))

    def _leaf(
        self,
        cn: str,
        dns: tuple[str, ...],
        ips: tuple[str, ...],
        crt: Path,
        key_path: Path,
        usage: x509.ObjectIdentifier,
        signer: tuple[Path, Path],
    ) -> None:
        ca_key = serialization.load_pem_private_key(signer[1].read_bytes(), password=None)
        assert isinstance(ca_key, rsa.RSAPrivateKey)
        ca = x509.load_pem_x509_certificate(signer[0].read_bytes())
        key = _rsa_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        builder = _builder(subject, ca.subject, key)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = (
            builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(key_path, key)
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _self_signed_ca(cn: str, crt: Path, key_path: Path) -> None:
    key = _rsa_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
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
