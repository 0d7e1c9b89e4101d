"""MIME text of received mail, for the email skill: headers and bodies as readable text. Stdlib only.

Chinese mail labelled gb2312/gbk often holds GBK-only characters (喆 镕 堃) that the label's
codec cannot decode; the stdlib's default policy turns them into U+FFFD. Messages are
therefore parsed with the compat32 policy (`email.message_from_bytes`) and every header and
body is decoded here, with gb2312/gbk/cp936 mapped to gb18030 (a superset), falling back to
UTF-8/GB18030 when a label is missing or wrong. Attachment names in raw 8-bit headers
(Foxmail, older Outlook: GBK or UTF-8 bytes, no RFC 2047/2231) are decoded from the raw header
bytes (UTF-8, else GB18030); the compat32 parser would otherwise hand them over as U+FFFD.

Not handled: attachment contents (only their names), inline images, S/MIME and PGP, HTML
layout beyond line breaks at block elements.
"""
import codecs
import email.header
import email.utils
import html.parser
import re
from email.errors import HeaderParseError
from email.message import Message

ATTACHMENTS_MAX = 100       # attachment names listed by `read`
NAME_MAX = 255              # characters of one attachment name

# Labels whose codec is too narrow for what senders put in them; None = no usable label.
CHARSET_ALIASES = {
    "gb2312": "gb18030", "gb_2312-80": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030",
    "cp936": "gb18030", "ms936": "gb18030", "euc-cn": "gb18030", "x-euc-cn": "gb18030",
    "csgb2312": "gb18030", "chinese": "gb18030", "iso-ir-58": "gb18030", "gb18030": "gb18030",
    "big5": "big5hkscs", "ks_c_5601-1987": "cp949", "euc-kr": "cp949",
    "us-ascii": "utf-8", "ascii": "utf-8", "iso-8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252",
    "unknown-8bit": None, "x-unknown": None, "unknown": None, "default": None,
}


def codec_for(charset):
    """The Python codec for a MIME charset label; None when there is no usable label."""
    name = (charset or "").strip().strip("\"'").lower()
    if name in CHARSET_ALIASES:
        return CHARSET_ALIASES[name]
    if not name:
        return None
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def decode_bytes(data, charset=None):
    """Decode message bytes by their label, falling back when the label is missing or wrong."""
    name = codec_for(charset)
    candidates = [name, "utf-8"] if name else ["utf-8", "gb18030"]
    for candidate in candidates:
        try:
            return data.decode(candidate)
        except (UnicodeDecodeError, LookupError):
            continue
    return data.decode(name or "utf-8", "replace")


def clean(text):
    """A str from the parser may carry raw 8-bit bytes as surrogates: decode those properly."""
    if any("\udc80" <= ch <= "\udcff" for ch in text):
        return decode_bytes(text.encode("utf-8", "surrogateescape"))
    return text


def header_text(value):
    """A header value as readable text: RFC 2047 words decoded with mapped charsets, unfolded."""
    if value is None:
        return ""
    try:
        parts = email.header.decode_header(value)
    except (HeaderParseError, ValueError, LookupError):
        return " ".join(clean(str(value)).split())
    out = []
    for chunk, charset in parts:
        out.append(decode_bytes(chunk, charset) if isinstance(chunk, bytes) else clean(chunk))
    return " ".join("".join(out).split())


class _HTMLText(html.parser.HTMLParser):
    """Visible text of an HTML body: no tags, scripts or styles; block elements start new lines."""
    SKIP = {"script", "style", "title"}
    BLOCK = {"p", "div", "br", "li", "tr", "table", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote",
             "pre", "hr", "ul", "ol", "dl", "dt", "dd", "section", "article", "header", "footer"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag in self.BLOCK:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.out.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)


def html_to_text(markup):
    parser = _HTMLText()
    try:
        parser.feed(markup)
        parser.close()
    except Exception:           # malformed markup: keep what was parsed
        pass
    lines = [" ".join(line.split()) for line in "".join(parser.out).splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def raw_header(part, name):
    """A header's value as text, raw 8-bit bytes decoded (UTF-8, else GB18030); None if absent."""
    for key, value in part.raw_items():
        if key.lower() == name:
            return clean(value) if isinstance(value, str) else str(value)
    return None


def header_param(part, header, param):
    """A parameter of a header, read from the raw value (compat32 turns 8-bit bytes into U+FFFD)."""
    value = raw_header(part, header)
    if value is None:
        return None
    holder = Message()
    holder[header] = value
    return holder.get_param(param, None, header)


def part_filename(part):
    """The attachment name of a MIME part (RFC 2231, RFC 2047 or raw 8-bit), or None."""
    raw = header_param(part, "content-disposition", "filename")
    if raw is None:
        raw = header_param(part, "content-type", "name")
    if raw is None:
        return None
    if isinstance(raw, tuple):      # RFC 2231: (charset, language, value as latin-1 text)
        charset, _language, value = raw
        text = decode_bytes(value.encode("latin-1", "replace"), charset)
    else:
        text = clean(email.utils.unquote(raw))
    if "=?" in text:
        text = header_text(text)
    return text[:NAME_MAX]


def part_text(part):
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return ""
    return decode_bytes(payload, part.get_content_charset())


def message_body(msg):
    """(body text, attachment names): text/plain preferred, else text/html without tags."""
    plain = markup = None
    attachments = []
    for part in msg.walk():
        if part.is_multipart():
            continue
        name = part_filename(part)
        if part.get_content_disposition() == "attachment" or name is not None:
            if len(attachments) < ATTACHMENTS_MAX:
                attachments.append(name or "(unnamed)")
            continue
        kind = part.get_content_type()
        if kind == "text/plain" and plain is None:
            plain = part_text(part)
        elif kind == "text/html" and markup is None:
            markup = part_text(part)
    if plain is not None and plain.strip():
        body = plain
    elif markup is not None:
        body = html_to_text(markup)
    else:
        body = plain or ""
    return body.replace("\r\n", "\n").strip(), attachments
