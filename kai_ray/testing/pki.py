"""Certificates and keys for a throw-away local control plane.

EC P-256 keys: generating them takes milliseconds, which keeps the plane's start fast.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_CLUSTER_IP = "10.96.0.1"  # first address of the service range the apiserver is given
_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    """Paths of the files `write_pki` created."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _name(common_name: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
             ) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _leaf(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, subject: x509.Name,
          usage: x509.ObjectIdentifier, san: x509.SubjectAlternativeName | None = None
          ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    b = (
        _builder(subject, ca.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=False, content_commitment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if san is not None:
        b = b.add_extension(san, critical=False)
    return b.sign(ca_key, hashes.SHA256()), key


def write_pki(directory: Path, extra_ips: Sequence[str] = ()) -> Pki:
    """A CA, the apiserver's serving cert, an admin client cert and the service-account keys.

    extra_ips: more addresses the apiserver is reached at (the real node's pods use its
    advertised address), added to the serving cert.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_subject = _name("kai-ray-local-ca")
    ca = (
        _builder(ca_subject, ca_subject, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=False, content_commitment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    san = x509.SubjectAlternativeName([
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address(SERVICE_CLUSTER_IP)),
        *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips),
    ])
    serving, serving_key = _leaf(ca, ca_key, _name("kube-apiserver"),
                                 ExtendedKeyUsageOID.SERVER_AUTH, san)
    # O=system:masters: the built-in group every authorizer lets do anything.
    admin, admin_key = _leaf(ca, ca_key, _name("kai-ray-admin", "system:masters"),
                             ExtendedKeyUsageOID.CLIENT_AUTH)
    sa_key = _key()

    pki = Pki(
        ca_cert=directory / "ca.crt", ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt", serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt", admin_key=directory / "admin.key",
        sa_key=directory / "sa.key", sa_pub=directory / "sa.pub",
    )
    pem = serialization.Encoding.PEM
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    pki.serving_cert.write_bytes(serving.public_bytes(pem))
    pki.admin_cert.write_bytes(admin.public_bytes(pem))
    for path, key in ((pki.ca_key, ca_key), (pki.serving_key, serving_key),
                      (pki.admin_key, admin_key), (pki.sa_key, sa_key)):
        path.write_bytes(_key_pem(key))
        path.chmod(0o600)
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(
        pem, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


def issue_cert(pki: Pki, directory: Path, stem: str, common_name: str, *,
               org: str | None = None, client: bool = True, dns: Sequence[str] = (),
               ips: Sequence[str] = ()) -> tuple[Path, Path]:
    """Another leaf cert signed by the plane's CA: <stem>.crt and <stem>.key in `directory`.

    client=True: a client cert (CN is the user, O the group); else a serving cert for the
    given DNS names and IPs. Used for the real node: the kubelet's identity towards the API
    server (system:node:<name>) and its serving cert, the API server's client cert towards the
    kubelet, kube-proxy's identity.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    san = None
    if not client:
        san = x509.SubjectAlternativeName(
            [x509.DNSName(d) for d in dns]
            + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips])
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    cert, key = _leaf(ca, ca_key, _name(common_name, org), usage, san)
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_key_pem(key))
    key_path.chmod(0o600)
    return cert_path, key_path


def write_kubeconfig(path: Path, server: str, pki: Pki, name: str = "kai-ray-local",
                     cert: tuple[Path, Path] | None = None) -> Path:
    """A self-contained kubeconfig (certificates embedded) for the admin user, or for the
    client cert and key given as `cert`."""
    cert_file, key_file = cert or (pki.admin_cert, pki.admin_key)

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server, "certificate-authority-data": b64(pki.ca_cert)}}],
        "users": [{"name": f"{name}-admin", "user": {
            "client-certificate-data": b64(cert_file),
            "client-key-data": b64(key_file)}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin"}}],
        "current-context": name,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
