"""`prepare fetch` follows a redirect only to http(s): every hop is checked, not just the first URL."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lcft.errors import LcftError
from lcft.genomics.fetch import fetch_fasta

FASTA = b">chrA\n" + b"ACGT" * 50 + b"\n"


class Redirects(BaseHTTPRequestHandler):
    """/ok.fa serves a FASTA; /hop -> /ok.fa (http); /ftp.fa -> ftp://; /twice.fa -> /hop2 -> ftp://."""

    targets = {"/hop.fa": "/ok.fa", "/ftp.fa": "ftp://127.0.0.1/ok.fa", "/twice.fa": "/hop2",
               "/hop2": "ftp://127.0.0.1/second.fa", "/md5/g.fa": "/ok.fa", "/md5/md5sum.txt": "ftp://127.0.0.1/md5sum.txt"}
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.hits.append(self.path)
        if self.path in self.targets:
            self.send_response(302)
            self.send_header("Location", self.targets[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path != "/ok.fa":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(FASTA)))
        self.end_headers()
        self.wfile.write(FASTA)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def base():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Redirects)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_http_redirect_is_followed(base, tmp_path):
    fa = fetch_fasta(url=f"{base}/hop.fa", md5="skip", out=tmp_path)
    assert fa.read_bytes() == FASTA


@pytest.mark.parametrize("path,target", [("/ftp.fa", "ftp://"), ("/twice.fa", "ftp://127.0.0.1/second")])
def test_redirect_to_another_scheme_is_refused(base, tmp_path, path, target):
    with pytest.raises(LcftError, match=f"redirects to {target}.*not an http"):
        fetch_fasta(url=f"{base}{path}", md5="skip", out=tmp_path)
    assert not list(tmp_path.glob("*.fa"))


def test_redirect_of_the_md5_list_is_checked_too(base, tmp_path):
    with pytest.raises(LcftError, match="md5sum.txt redirects to ftp://"):
        fetch_fasta(url=f"{base}/md5/g.fa", out=tmp_path)
