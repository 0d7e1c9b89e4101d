"""WeChat through Tencent's iLink bot API: `ilink` (the HTTP client and the protocol's constants),
`channel` (polling, sending, the send budget and the 24-hour window) and `login` (the QR login, status,
logout, and the credentials the daemon uses)."""
