"""WARC/1.1 writing shared by the web-page fixture generators (make-extract-eval.py,
make-extract-web.py): records with their Content-Length, each gzipped as its own member
(the layout Common Crawl ships and `mtnlg data extract` reads), and record ids numbered
from 1 under a prefix of the generator's own, so that the files are byte-stable."""
import gzip
import io


class RecordIds:
    """rid() -> "<urn:uuid:PREFIX000000000001>", then ...002, ..."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.n = 0

    def __call__(self):
        self.n += 1
        return f"<urn:uuid:{self.prefix}{self.n:012d}>"


def warc_record(headers, block):
    h = "WARC/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + f"Content-Length: {len(block)}\r\n\r\n"
    return h.encode() + block + b"\r\n\r\n"


def gz_member(data):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as g:
        g.write(data)
    return buf.getvalue()
