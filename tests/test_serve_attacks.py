"""`fhe serve` attacked as a stranger would, on loopback: every case ends with the server alive and
no wrong answer. Foreign keys padded to this circuit's size, the same keys planted in the store (a
native crash in the worker), damaged stored keys, kill -9 in the middle of an upload, bodies that
announce more than they send, tokens, quotas, rate limits, a full queue, inputs that would overflow,
random requests (hypothesis), and a bounded concurrent load."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_deploy import FHE, OCTET, Served, _tfhe_artifact
from test_deploy import ckks_art as ckks_art  # a fixture, shared

from fhe import wire
from fhe.deploy.access import add_token
from fhe.deploy.client import Client, ServiceError
from fhe.errors import InputOverflowError


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    root = tmp_path_factory.mktemp("attack")
    graph = _tfhe_artifact(root / "a")
    _tfhe_artifact(root / "b")  # the same circuit, other keys
    _tfhe_artifact(root / "small", rounding=5)  # another circuit, with smaller keys
    return root, graph


def _padded_foreign_keys(root: Path) -> bytes:
    """Another circuit's evaluation keys padded with zeros to this circuit's key size: they
    deserialise, and running with them kills the process (SIGSEGV in Concrete's keyswitch)."""
    own = (root / "a" / "server" / "evaluation_keys.bin").stat().st_size
    small = (root / "small" / "server" / "evaluation_keys.bin").read_bytes()
    assert len(small) < own
    return small + b"\0" * (own - len(small))


def _alive(served: Served) -> bool:
    return served.proc.poll() is None and httpx.get(served.url + "/health", timeout=10).is_success


def _expected(graph, x) -> np.ndarray:
    return graph.run(np.asarray(x, dtype=np.int64))[0] * 0.5


def _raw(port: int, head: str) -> tuple[int, str]:
    """Sends request headers only (no body) and reads the answer: proves the server answered
    without reading the body that the headers announce."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode())
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1].decode(errors="replace")


@pytest.mark.attack(
    what=(
        "another circuit's TFHE keys padded with zeros to this circuit's size; the same bytes "
        "planted in the store, then /infer (a real SIGSEGV in Concrete's keyswitch)"
    ),
    answer=(
        "400 at upload; planted: 500 (the worker died, the server did not), then 410 "
        "(quarantined), still 410 after a restart and at upload"
    ),
    kept="another client's keys answer right after the crash",
)
def test_foreign_keys_padded_to_size_are_refused_and_planted_ones_crash_only_a_worker(
    arts, tmp_path
):
    root, graph = arts
    padded = _padded_foreign_keys(root)
    served = Served(root / "a", "--keys-dir", str(tmp_path / "keys"))
    try:
        resp = httpx.put(served.url + "/keys", content=padded, headers=OCTET, timeout=120)
        assert resp.status_code == 400 and "whole Concrete key set" in resp.json()["detail"]
        # the same bytes in the store already (a store written before this check existed)
        bad_id = hashlib.sha256(padded).hexdigest()
        (tmp_path / "keys" / "anonymous").mkdir(parents=True, exist_ok=True)
        (tmp_path / "keys" / "anonymous" / f"{bad_id}.bin").write_bytes(padded)
        client = Client(root / "a" / "client", served.url)
        ct = client.encrypt(np.zeros(4))
        resp = httpx.post(f"{served.url}/infer/{bad_id}", content=ct, headers=OCTET, timeout=120)
        assert resp.status_code == 500, resp.text
        assert "crashed its worker" in resp.json()["detail"] and "SIG" in resp.json()["detail"]
        assert _alive(served)
        again = httpx.post(f"{served.url}/infer/{bad_id}", content=ct, headers=OCTET, timeout=60)
        assert again.status_code == 410 and "quarantined" in again.json()["detail"]
        x = np.array([3, 1, 4, 1])
        np.testing.assert_array_equal(client.predict(x).logits, _expected(graph, x))
        served.stop()
        served.start()  # the quarantine survives a restart
        again = httpx.post(f"{served.url}/infer/{bad_id}", content=ct, headers=OCTET, timeout=60)
        assert again.status_code == 410
        resp = httpx.put(served.url + "/keys", content=padded, headers=OCTET, timeout=120)
        assert resp.status_code == 410  # a quarantined id is refused at upload too
    finally:
        served.stop()


@pytest.mark.attack(
    what="64 flipped bytes in a stored key file, server restarted",
    answer="409 'upload your keys again'; the file set aside; the client re-uploads by itself",
    kept="the repaired file equals the original keys; the answer equals the clear program",
)
def test_damaged_stored_keys_are_set_aside_and_a_reupload_repairs_them(arts, tmp_path):
    root, graph = arts
    served = Served(root / "a", "--keys-dir", str(tmp_path / "keys"))
    try:
        client = Client(root / "a" / "client", served.url)
        key_id = client.upload_keys()
        stored = tmp_path / "keys" / "anonymous" / f"{key_id}.bin"
        blob = bytearray(stored.read_bytes())
        middle = len(blob) // 2
        blob[middle : middle + 64] = bytes(b ^ 0xFF for b in blob[middle : middle + 64])
        served.stop()  # the worker holds the good keys in memory; a restart reads the file
        stored.write_bytes(bytes(blob))
        served.start()
        client = Client(root / "a" / "client", served.url)  # the restarted server's port
        ct = client.encrypt(np.full(4, 9.0))
        resp = httpx.post(f"{served.url}/infer/{key_id}", content=ct, headers=OCTET, timeout=120)
        assert resp.status_code == 409 and "upload your keys again" in resp.json()["detail"]
        assert list((tmp_path / "keys" / ".damaged").iterdir())  # kept for inspection
        assert not stored.exists()
        # the Python client uploads again by itself and gets the right answer
        x = np.full(4, 9)
        np.testing.assert_array_equal(client.predict(x.astype(float)).logits, _expected(graph, x))
        assert stored.read_bytes() == (root / "a" / "server" / "evaluation_keys.bin").read_bytes()
        assert _alive(served)
    finally:
        served.stop()


@pytest.mark.attack(
    what="kill -9 of the server in the middle of a chunked key upload, then a restart",
    answer="the spool is swept at start",
    kept="nothing half-written is stored",
)
def test_kill_9_during_an_upload_leaves_nothing_after_a_restart(arts, tmp_path):
    root, _ = arts
    keys_dir = tmp_path / "keys"
    served = Served(root / "a", "--keys-dir", str(keys_dir))
    blob = (root / "a" / "server" / "evaluation_keys.bin").read_bytes()

    def slow():
        for i in range(0, len(blob), 1 << 20):
            yield blob[i : i + (1 << 20)]
            time.sleep(0.05)

    def upload():
        with contextlib.suppress(httpx.HTTPError):
            httpx.put(served.url + "/keys", content=slow(), headers=OCTET, timeout=60)

    thread = threading.Thread(target=upload)
    thread.start()
    deadline = time.time() + 30
    while not list((keys_dir / ".spool").glob("*")) and time.time() < deadline:
        time.sleep(0.05)
    assert list((keys_dir / ".spool").glob("*")), "the upload should be spooling"
    os.kill(served.proc.pid, signal.SIGKILL)
    served.proc.wait(timeout=30)
    thread.join(timeout=60)
    assert list((keys_dir / ".spool").glob("*"))  # what the killed upload left
    served.start()
    try:
        assert not list((keys_dir / ".spool").glob("*"))
        assert not list(keys_dir.glob("*/*.bin"))  # nothing half-written was stored
        assert _alive(served)
    finally:
        served.stop()


@pytest.mark.attack(
    what=(
        "headers announcing a 16 GiB body (unknown key id, known key id) and keys of the wrong size"
    ),
    answer="404 / 413 / 400 before a byte of the body is read",
    kept="n/a (nothing stored)",
)
def test_bodies_are_refused_from_their_headers_before_they_are_read(arts, tmp_path):
    root, _ = arts
    served = Served(root / "a", "--keys-dir", str(tmp_path / "keys"), "--max-payload-mb", "1")
    try:
        key_id = Client(root / "a" / "client", served.url).upload_keys()
        head = "POST /infer/{} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        head += "Content-Length: {}\r\n\r\n"
        status, body = _raw(served.port, head.format("0" * 64, 1 << 34))
        assert status == 404 and "unknown key id" in body
        status, body = _raw(served.port, head.format(key_id, 1 << 34))
        assert status == 413 and "limit" in body
        put = "PUT /keys HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        status, body = _raw(served.port, put + "Content-Length: 1000\r\n\r\n")
        assert status == 400 and "this circuit's are" in body
        assert _alive(served)
    finally:
        served.stop()


@pytest.mark.attack(
    what=(
        "CKKS: a key upload announcing more than the artifact's key bound, and a chunked one of "
        "zeros past it"
    ),
    answer="413 from the headers; 413 as the chunked body passes the bound",
    kept="nothing stored; the real keys then answer within tolerance",
)
def test_ckks_keys_are_bounded_by_the_artifacts_own_key_size(ckks_art, tmp_path):
    """CKKS keys have no exact size (compressed random polynomials), so the server bounds an
    upload by its own public keys' size: over the bound is a 413 from the headers, or as soon as a
    chunked body passes it, so no worker reads more than a real key set."""
    root, cm = ckks_art
    served = Served(root / "a", "--keys-dir", str(tmp_path / "keys"))
    try:
        client = Client(root / "a" / "client", served.url)
        bound = client.describe()["max_key_bytes"]
        own = len(client.public_keys())
        assert own <= bound <= 1.05 * own + (2 << 20)
        put = "PUT /keys HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        status, body = _raw(served.port, put + f"Content-Length: {bound + 1}\r\n\r\n")
        assert status == 413 and "limit" in body
        zeros = (b"\0" * (1 << 20) for _ in range(bound // (1 << 20) + 2))  # no Content-Length
        resp = httpx.put(served.url + "/keys", content=zeros, headers=OCTET, timeout=120)
        assert resp.status_code == 413
        assert not list((tmp_path / "keys").glob("*/*.bin"))
        x = np.random.default_rng(3).standard_normal((8, 4, 3))
        got = client.predict(x)  # real keys still go through
        clear = cm.clear(x)
        assert np.max(np.abs(got.logits - clear)) < 1e-3 * max(1.0, np.abs(clear).max())
        assert _alive(served)
    finally:
        served.stop()


@pytest.mark.attack(
    what=(
        "no token, a wrong token, another tenant's key id, a tenant over its quota, a burst over "
        "its rate, /docs"
    ),
    answer="401, 401, 404 (as for a key that does not exist), 413, 429 with Retry-After, 404",
    kept=(
        "the owner's answers equal the clear program; LRU eviction only within the tenant's own "
        "keys"
    ),
)
def test_tokens_own_their_keys_and_meet_quotas_and_rates(arts, tmp_path):
    root, graph = arts
    tokens = tmp_path / "tokens.json"
    alice = add_token(tokens, "alice", max_store_mb=40)  # room for one key set of ~31 MiB
    bob = add_token(tokens, "bob", max_store_mb=10)  # no room for any
    carol = add_token(tokens, "carol", requests_per_minute=6)  # a burst of one request
    assert alice not in tokens.read_text()  # only hashes are stored
    served = Served(root / "a", "--keys-dir", str(tmp_path / "keys"), "--tokens", str(tokens))
    try:
        url = served.url
        assert httpx.get(url + "/model", timeout=30).status_code == 401
        bearer = {"authorization": "Bearer not-a-token"}
        assert httpx.get(url + "/model", headers=bearer, timeout=30).status_code == 401
        assert httpx.get(url + "/docs", timeout=30).status_code == 404
        assert httpx.get(url + "/openapi.json", timeout=30).status_code == 404
        a = Client(root / "a" / "client", url, token=alice)
        key_a = a.upload_keys()
        x = np.array([2, 7, 1, 8])
        np.testing.assert_array_equal(a.predict(x.astype(float)).logits, _expected(graph, x))
        as_bob = {"authorization": f"Bearer {bob}", **OCTET}
        assert httpx.get(f"{url}/keys/{key_a}", headers=as_bob, timeout=30).status_code == 404
        resp = httpx.post(f"{url}/infer/{key_a}", content=a.encrypt(x), headers=as_bob, timeout=60)
        assert resp.status_code == 404  # bob cannot compute with alice's keys
        with pytest.raises(ServiceError, match="413"):
            Client(root / "b" / "client", url, token=bob).upload_keys()
        key_b = Client(root / "b" / "client", url, token=alice).upload_keys()  # evicts key_a
        assert not (tmp_path / "keys" / "alice" / f"{key_a}.bin").exists()
        assert (tmp_path / "keys" / "alice" / f"{key_b}.bin").exists()
        as_carol = {"authorization": f"Bearer {carol}"}
        first = httpx.get(url + "/model", headers=as_carol, timeout=30)
        second = httpx.get(url + "/model", headers=as_carol, timeout=30)
        assert first.status_code == 200 and second.status_code == 429
        assert int(second.headers["retry-after"]) >= 1
    finally:
        served.stop()


@pytest.mark.attack(
    what="`fhe serve --host 0.0.0.0` without --tokens",
    answer="usage error (exit 2), nothing served",
    kept="n/a",
)
def test_serve_refuses_an_open_host_without_tokens(arts):
    import subprocess

    res = subprocess.run(
        [FHE, "serve", str(arts[0] / "a"), "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "--tokens" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.attack(
    what=(
        "a slow body holding the only admission slot; then 16 concurrent clients against a queue "
        "of 4"
    ),
    answer="503 with Retry-After; the rest answered",
    kept="every answer equals the clear program",
)
def test_a_full_queue_answers_503_and_the_load_gets_only_right_answers(arts, tmp_path):
    root, graph = arts
    served = Served(root / "a", "--keys-dir", str(tmp_path / "keys"), "--queue", "0")
    try:
        client = Client(root / "a" / "client", served.url)
        key_id = client.upload_keys()
        ct = client.encrypt(np.zeros(4))

        def trickle():  # holds the only admission slot while its body arrives
            yield ct[:10]
            time.sleep(3)
            yield ct[10:]

        holder = threading.Thread(
            target=lambda: httpx.post(
                f"{served.url}/infer/{key_id}", content=trickle(), headers=OCTET, timeout=60
            )
        )
        holder.start()
        time.sleep(1)
        resp = httpx.post(f"{served.url}/infer/{key_id}", content=ct, headers=OCTET, timeout=60)
        assert resp.status_code == 503 and resp.headers["retry-after"]
        holder.join()
    finally:
        served.stop()
    served = Served(root / "a", "--keys-dir", str(tmp_path / "keys"), "--queue", "4")
    try:
        xs = np.random.default_rng(5).integers(0, 16, size=(16, 4))
        answers: dict[int, object] = {}

        def ask(i: int) -> None:
            c = Client(root / "a" / "client", served.url)
            try:
                answers[i] = c.predict(xs[i].astype(float)).logits
            except ServiceError as exc:
                answers[i] = exc

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ok = [i for i, a in answers.items() if isinstance(a, np.ndarray)]
        assert len(answers) == 16 and ok
        for i, a in answers.items():
            if isinstance(a, ServiceError):
                assert a.status == 503 and a.retry_after_s
            else:
                np.testing.assert_array_equal(a, _expected(graph, xs[i]))
        assert _alive(served)
    finally:
        served.stop()


@pytest.mark.attack(
    what="an input outside the calibrated widths, through the Python client",
    answer="InputOverflowError (or, with allow_overflow, a warning)",
    kept="n/a (refused before encryption)",
)
def test_every_path_refuses_an_input_that_would_overflow(arts):
    """A circuit calibrated on inputs 0-3: an input of 15s overflows a width (the circuit would wrap
    around where the clear program saturates), so the client refuses it, as fhe compare does."""
    root = arts[0]
    graph = _tfhe_artifact(root / "narrow", calib_high=4)
    bad, good = np.full(4, 15), np.array([1, 2, 3, 0])
    assert graph.run(bad, "clip")[1] and not graph.run(good, "clip")[1]
    client = Client(root / "narrow" / "client")
    with pytest.raises(InputOverflowError, match="calibrated bit widths"):
        client.encrypt(bad.astype(float))
    lenient = Client(root / "narrow" / "client", allow_overflow=True)
    lenient.encrypt(bad.astype(float))
    assert lenient.warnings and "encrypted anyway" in lenient.warnings[0]
    client.encrypt(good.astype(float))  # an input within the widths is encrypted as before
    assert not client.warnings


@pytest.fixture(scope="module")
def fuzz_server(arts, tmp_path_factory):
    served = Served(
        arts[0] / "a", "--keys-dir", str(tmp_path_factory.mktemp("fuzz")), "--max-payload-mb", "1"
    )
    yield served
    served.stop()


@pytest.mark.attack(
    what="40 random requests (hypothesis): methods, paths, key ids, bodies, content types",
    answer="always < 500, always a `detail`",
    kept="n/a",
)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    method=st.sampled_from(["GET", "PUT", "POST", "DELETE"]),
    path=st.sampled_from(["/keys", "/model", "/health", "/infer/", "/keys/", "/docs"]),
    suffix=st.one_of(st.just(""), st.text(alphabet="0123456789abcdef", max_size=70)),
    body=st.one_of(
        st.binary(max_size=256), st.builds(lambda b: wire.pack([b]), st.binary(max_size=64))
    ),
    content_type=st.sampled_from(["application/octet-stream", "application/json", ""]),
)
def test_random_requests_never_get_a_5xx(fuzz_server, method, path, suffix, body, content_type):
    headers = {"content-type": content_type} if content_type else {}
    resp = httpx.request(
        method, fuzz_server.url + path + suffix, content=body, headers=headers, timeout=60
    )
    assert resp.status_code < 500, (method, path, suffix, resp.status_code, resp.text)
    if resp.status_code >= 400:
        assert "detail" in json.loads(resp.text)


@pytest.fixture(scope="module")
def docs_server(arts, tmp_path_factory):
    served = Served(
        arts[0] / "a",
        *("--keys-dir", str(tmp_path_factory.mktemp("schema")), "--max-payload-mb", "1", "--docs"),
    )
    yield served
    served.stop()


@pytest.mark.attack(
    what=(
        "60 requests generated from the service's OpenAPI schema (schemathesis), valid and invalid"
    ),
    answer="never a 5xx; status codes, content types and bodies as the schema declares",
    kept="n/a",
)
def test_generated_requests_hold_to_the_openapi_schema(docs_server):
    """Requests generated from the service's own OpenAPI schema (schemathesis), every operation:
    never a 5xx, every status code, content type and body as the schema declares them. Left out:
    "schema-valid data is accepted", since the schema can say "bytes" but not "a key set or
    ciphertexts made for this circuit", and random bytes must get a 400."""
    schema = schemathesis.openapi.from_url(docs_server.url + "/openapi.json")

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=schema.as_strategy())
    def check(case):
        case.call_and_validate(
            base_url=docs_server.url,
            timeout=60,
            excluded_checks=[schemathesis.checks.positive_data_acceptance],
        )

    check()
