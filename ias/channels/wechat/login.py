"""The WeChat login: the iLink QR flow that yields the bot token, its status, logout, and credentials.

`login` fetches a QR code, shows it (drawn in the terminal when the optional `segno` package
is installed, and always as text), long-polls its status until the owner confirms on the
phone, and stores token, base URL, bot id and owner in `channel_state` (channel "wechat"),
dropping the old cursor, context tokens and any stale mark. A `scaned_but_redirect` host
without a scheme is polled with the scheme of the URL being polled (https in production,
http against a local test server); a host with a scheme is used as is, except that an
https flow is never downgraded to http.

Not handled: several bots or owners, re-using an existing token (`local_token_list` is sent
empty), a logout on the iLink side (logout only forgets the local state).
"""
from __future__ import annotations

import asyncio
import inspect
import io
import logging
import time
from typing import Awaitable, Callable
from urllib.parse import quote, urlsplit

from ... import limits
from ...errors import ConfigError
from .ilink import (BASE_URL, BOT_ID, CHANNEL, CURSOR, DEFAULT_BASE_URL, GET_QRCODE, OWNER, PEER, QRCODE_STATUS,
                    STALE_MARK, TOKEN, Credentials, ILink, LoginState, WeChatError)

log = logging.getLogger(__name__)

SHOW = "请用手机微信扫描下面的二维码，把 iAs 绑定为你的微信机器人："
LINK = "若二维码无法显示或无法扫描，请用浏览器打开以下链接，再用手机微信扫码：\n{content}"
SCANNED = "已扫码，请在手机微信上确认登录。"
VERIFY = "请输入手机微信上显示的数字验证码："
VERIFY_AGAIN = "验证码不正确，请重新输入手机微信上显示的数字："
REFRESH = "二维码已过期，正在获取新的二维码（{n}/{total}）…"
DONE = "微信登录成功：机器人 {bot}，主人 {owner}。如 iAs 正在运行，请重启它以使用新的登录。"
BLOCKED = "验证码输错次数过多，微信已阻止本次登录。请稍后重新运行 `ias wechat login`。"
BOUND = ("这个微信已经绑定过 iAs 机器人（binded_redirect），本次没有生成新的登录。"
         "如需重新绑定，请先在微信里删除该机器人，再运行 `ias wechat login`。")
EXPIRED = "二维码已过期 {total} 次，登录已取消。请重新运行 `ias wechat login`。"
TIMEOUT = "登录超时（{minutes:g} 分钟内没有完成扫码确认），请重新运行 `ias wechat login`。"
UNREACHABLE = "连续 {n} 次无法查询二维码状态（{url}），登录已取消。请检查网络后重新运行 `ias wechat login`。"
INCOMPLETE = "微信确认了登录，但没有返回 bot_token 或 ilink_user_id，请重新运行 `ias wechat login`。"

Ask = Callable[[str], Awaitable[str]] | Callable[[str], str]


def draw(content: str) -> str | None:
    """The QR code as terminal text when `segno` is installed, else None."""
    try:
        import segno
    except ImportError:
        return None
    buffer = io.StringIO()
    try:
        try:
            segno.make(content).terminal(out=buffer, compact=True)
        except TypeError:       # segno < 1.6 has no compact mode
            segno.make(content).terminal(out=buffer)
    except Exception:           # an optional drawing must never break the login
        log.debug("drawing the QR code failed", exc_info=True)
        return None
    return buffer.getvalue()


def redirect_url(current: str, host: str) -> str:
    """Where `scaned_but_redirect` continues: `host` with the current scheme, or as given (never https → http)."""
    host = host.strip().rstrip("/")
    scheme = urlsplit(current).scheme or "https"
    if "://" in host:
        given = urlsplit(host).scheme
        return host if given == "https" or scheme != "https" else f"https://{host.split('://', 1)[1]}"
    return f"{scheme}://{host}"


def _base(value: object, fallback: str) -> str:
    if not isinstance(value, str) or not value.strip():
        return fallback.rstrip("/")
    value = value.strip().rstrip("/")
    return value if "://" in value else f"https://{value}"


async def _qrcode(api: ILink, out: Callable[[str], None]) -> str:
    """Fetch a new QR code, show it; its id."""
    try:
        reply = await api.post(GET_QRCODE, {"local_token_list": []},
                               limits.WECHAT_REQUEST_TIMEOUT)
    except TimeoutError:
        raise WeChatError(f"获取微信登录二维码超时（{api.base_url}），请检查网络后重试。") from None
    except (OSError, WeChatError) as exc:
        raise WeChatError(f"无法获取微信登录二维码（{api.base_url}）：{exc}") from None
    qrcode, content = reply.get("qrcode"), reply.get("qrcode_img_content")
    if not isinstance(qrcode, str) or not qrcode or not isinstance(content, str) or not content:
        raise WeChatError(f"获取微信登录二维码失败：服务器返回的数据不完整（ret {reply.get('ret')}）。")
    out(SHOW)
    drawing = draw(content)
    if drawing:
        out(drawing)
    out(LINK.format(content=content))
    return qrcode


async def _status(api: ILink, qrcode: str, code: str | None, timeout: float) -> dict | None:
    """One long poll of the QR status: the reply, `wait` on a client timeout, None when it failed."""
    query = f"qrcode={quote(qrcode, safe='')}" + (f"&verify_code={quote(code, safe='')}" if code else "")
    try:
        return await api.get(f"{QRCODE_STATUS}?{query}", timeout)
    except TimeoutError:
        return {"status": "wait"}
    except (OSError, WeChatError) as exc:
        log.warning("WeChat login: status poll at %s failed (%s)", api.base_url, exc)
        return None


async def _answer(ask: Ask, prompt: str, timeout: float, deadline: float) -> str:
    """The user's answer; an awaitable `ask` is bounded by what is left of the login's time."""
    answer = ask(prompt)
    if inspect.isawaitable(answer):
        try:
            answer = await asyncio.wait_for(answer, max(timeout, 0.001))
        except TimeoutError:
            raise WeChatError(TIMEOUT.format(minutes=deadline / 60)) from None
    return str(answer or "").strip()


async def login(store, base_url: str = DEFAULT_BASE_URL, *, out: Callable[[str], None], ask: Ask,
                now: Callable[[], float] = time.monotonic, deadline: float = limits.WECHAT_LOGIN_DEADLINE,
                poll_timeout: float = limits.WECHAT_QR_POLL_TIMEOUT, pause: float = limits.WECHAT_QR_POLL_PAUSE) -> dict:
    """Run the QR login; store the credentials; {base_url, bot_id, owner}. Raises WeChatError (Chinese message)."""
    home = ILink(base_url)
    started = now()
    qrcode = await _qrcode(home, out)
    shown, api, code, told, failures = 1, home, None, False, 0
    while (left := deadline - (now() - started)) > 0:
        reply = await _status(api, qrcode, code, min(poll_timeout, left))
        if reply is None:
            failures += 1
            if failures >= limits.WECHAT_QR_POLL_ERRORS_MAX:
                raise WeChatError(UNREACHABLE.format(url=api.base_url, n=failures))
            await asyncio.sleep(pause)
            continue
        failures = 0
        status = reply.get("status")
        if status == "confirmed":
            return await _confirm(store, reply, base_url, out)
        if status == "scaned" and not told:
            out(SCANNED)
            told = True
        elif status == "need_verifycode":
            code = await _answer(ask, VERIFY_AGAIN if code else VERIFY, deadline - (now() - started), deadline)
            continue
        elif status == "verify_code_blocked":
            raise WeChatError(BLOCKED)
        elif status == "binded_redirect":
            raise WeChatError(BOUND)
        elif status == "expired":
            if shown >= limits.WECHAT_QR_CODES_MAX:
                raise WeChatError(EXPIRED.format(total=shown))
            shown += 1
            out(REFRESH.format(n=shown, total=limits.WECHAT_QR_CODES_MAX))
            qrcode = await _qrcode(home, out)
            api, code, told = home, None, False
            continue
        elif status == "scaned_but_redirect":
            host = reply.get("redirect_host")
            if isinstance(host, str) and host.strip():
                api = ILink(redirect_url(api.base_url, host))
                log.info("WeChat login: polling moved to %s", api.base_url)
                continue
            log.warning("WeChat login: scaned_but_redirect without redirect_host; polling the same host")
        elif status not in ("wait", "scaned"):
            log.warning("WeChat login: unexpected QR status %r (ret %r)", status, reply.get("ret"))
        await asyncio.sleep(pause)
    raise WeChatError(TIMEOUT.format(minutes=deadline / 60))


async def _confirm(store, reply: dict, base_url: str, out: Callable[[str], None]) -> dict:
    token, owner = reply.get("bot_token"), reply.get("ilink_user_id")
    if not isinstance(token, str) or not token or not isinstance(owner, str) or not owner:
        raise WeChatError(INCOMPLETE)
    bot_id = reply.get("ilink_bot_id") if isinstance(reply.get("ilink_bot_id"), str) else None
    base = _base(reply.get("baseurl"), base_url)
    await store.clear_state(CHANNEL)                # old cursor, context tokens and stale mark go too
    await store.set_state(CHANNEL, BASE_URL, base)
    await store.set_state(CHANNEL, BOT_ID, bot_id)
    await store.set_state(CHANNEL, OWNER, owner)
    await store.set_state(CHANNEL, TOKEN, token)    # last: a token means a complete login
    log.info("WeChat login confirmed: bot %s, owner %s, base URL %s", bot_id, owner, base)
    out(DONE.format(bot=bot_id or "?", owner=owner))
    return {"base_url": base, "bot_id": bot_id, "owner": owner}


def _when(epoch: object) -> str | None:
    if not isinstance(epoch, (int, float)) or isinstance(epoch, bool):
        return None
    from datetime import datetime
    try:
        return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):    # a stored time out of range is shown as unknown
        return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


async def status(store) -> LoginState:
    """The stored login, for `ias wechat status` and doctor; never the token."""
    def get(key: str):
        return store.get_state(CHANNEL, key)
    owner = _text(await get(OWNER))
    peer = await get(PEER + owner) if owner else None
    stale = await get(STALE_MARK)
    return LoginState(
        logged_in=bool(await get(TOKEN)),
        base_url=_text(await get(BASE_URL)),
        bot_id=_text(await get(BOT_ID)),
        owner=owner,
        cursor=bool(await get(CURSOR)),
        last_inbound=_when(peer.get("last_inbound")) if isinstance(peer, dict) else None,
        stale=stale is not None,
        stale_since=_when(stale.get("at")) if isinstance(stale, dict) else None,
    )


async def logout(store) -> None:
    """Forget the token and everything the channel stored (a running daemon keeps its copy until restarted)."""
    await store.clear_state(CHANNEL)


async def credentials(store, env_token: str | None, env_owner: str | None,
                      env_base_url: str | None) -> Credentials | None:
    """What the daemon logs in with: the environment (headless set-up) wins over the stored login; None without a token.

    With IAS_WECHAT_TOKEN the base URL is IAS_WECHAT_BASE_URL (else the default); with a stored
    login it is the base URL the login returned, because that URL belongs to that token.
    """
    stored_token = await store.get_state(CHANNEL, TOKEN)
    stored_owner = await store.get_state(CHANNEL, OWNER)
    if env_token:
        owner = env_owner or stored_owner
        if not owner:
            raise ConfigError("IAS_WECHAT_TOKEN is set but the owner is unknown: set IAS_WECHAT_OWNER to the "
                              "owner's iLink user id (like o9cq…@im.wechat)")
        bot_id = await store.get_state(CHANNEL, BOT_ID) if env_token == stored_token else None
        return Credentials(env_token, _base(env_base_url, DEFAULT_BASE_URL), bot_id, owner)
    if not stored_token:
        return None
    owner = env_owner or stored_owner
    if not owner:
        raise ConfigError("the stored WeChat login has no owner: run `ias wechat login` again or set IAS_WECHAT_OWNER")
    base = await store.get_state(CHANNEL, BASE_URL)
    return Credentials(stored_token, _base(base, env_base_url or DEFAULT_BASE_URL),
                       await store.get_state(CHANNEL, BOT_ID), owner)
