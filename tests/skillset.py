"""1,000 generated user skills and 200 labelled requests for tool selection (tests and `make bench`).

Each skill has an English name and description, a Chinese title, and one parameter, like a
user's own skill. Each request names what exactly one skill does, in Chinese or English, worded
differently from that skill's title and description (other verbs, word order, filler), as an
owner would say it. Two families of 500: home devices (room × device × action) and city
services (city × kind of information).
"""
from __future__ import annotations

import json
from pathlib import Path

ROOMS = [("bedroom", "bedroom", "卧室"), ("living", "living room", "客厅"), ("kitchen", "kitchen", "厨房"),
         ("bathroom", "bathroom", "浴室"), ("study", "study", "书房"), ("garage", "garage", "车库"),
         ("balcony", "balcony", "阳台"), ("nursery", "nursery", "儿童房"), ("guest", "guest room", "客房"),
         ("basement", "basement", "地下室")]
DEVICES = [("light", "ceiling light", "吊灯"), ("ac", "air conditioner", "空调"), ("heater", "heater", "暖气"),
           ("fan", "fan", "风扇"), ("curtain", "curtains", "窗帘"), ("speaker", "speaker", "音箱"),
           ("tv", "television", "电视"), ("humidifier", "humidifier", "加湿器"),
           ("purifier", "air purifier", "空气净化器"), ("vacuum", "robot vacuum", "扫地机器人")]
# slug, description (en), title (zh), request (en), request (zh)
ACTIONS = [
    ("on", "Turn on the {d} in the {r}.", "打开{R}{D}", "switch the {r} {d} on for me", "把{R}的{D}开起来"),
    ("off", "Turn off the {d} in the {r}.", "关闭{R}{D}", "the {r} {d} can go off now", "{R}{D}关掉吧"),
    ("status", "Report whether the {d} in the {r} is running and its current status.", "查询{R}{D}状态",
     "is the {d} in my {r} running right now", "看看{R}{D}现在什么状态"),
    ("level", "Set the level (brightness, temperature, speed or volume) of the {d} in the {r}.", "调节{R}{D}档位",
     "change the {d} level in the {r} to 3", "{R}{D}调到三档"),
    ("timer", "Schedule the {d} in the {r} to switch itself off after a delay.", "定时关闭{R}{D}",
     "let the {r} {d} switch off by itself after an hour", "给{R}{D}设个定时，一小时后自己关"),
]
CITIES = [("beijing", "Beijing", "北京"), ("shanghai", "Shanghai", "上海"), ("guangzhou", "Guangzhou", "广州"),
          ("shenzhen", "Shenzhen", "深圳"), ("chengdu", "Chengdu", "成都"), ("hangzhou", "Hangzhou", "杭州"),
          ("wuhan", "Wuhan", "武汉"), ("xian", "Xian", "西安"), ("nanjing", "Nanjing", "南京"),
          ("chongqing", "Chongqing", "重庆"), ("tianjin", "Tianjin", "天津"), ("suzhou", "Suzhou", "苏州"),
          ("changsha", "Changsha", "长沙"), ("qingdao", "Qingdao", "青岛"), ("xiamen", "Xiamen", "厦门"),
          ("kunming", "Kunming", "昆明"), ("dalian", "Dalian", "大连"), ("harbin", "Harbin", "哈尔滨"),
          ("zhengzhou", "Zhengzhou", "郑州"), ("jinan", "Jinan", "济南"), ("hefei", "Hefei", "合肥"),
          ("fuzhou", "Fuzhou", "福州"), ("shenyang", "Shenyang", "沈阳"), ("ningbo", "Ningbo", "宁波"),
          ("guiyang", "Guiyang", "贵阳")]
# slug, description (en), title (zh), request (en), request (zh)
KINDS = [
    ("aqi", "Look up the air quality index in {c}.", "{C}空气质量", "how bad is the air in {c} today", "{C}今天空气怎么样"),
    ("traffic", "Show road traffic congestion in {c}.", "{C}道路拥堵", "are the roads in {c} jammed with traffic", "{C}现在堵车吗"),
    ("subway", "List subway line delays in {c}.", "{C}地铁延误", "any metro trouble, is the {c} subway late", "{C}地铁晚点了没"),
    ("pollen", "Report the pollen count in {c}.", "{C}花粉浓度", "will pollen bother my allergy in {c}", "{C}花粉多不多"),
    ("uv", "Report the UV index (sunburn risk) in {c}.", "{C}紫外线指数", "do I need sunscreen in {c}, how strong is the uv",
     "{C}紫外线强吗"),
    ("parking", "Find free parking spaces near you in {c}.", "{C}空闲车位", "where can I park the car in {c}",
     "{C}哪里有车位停车"),
    ("fuel", "Check today's petrol and diesel prices in {c}.", "{C}油价", "how much does petrol cost in {c} now",
     "{C}加油多少钱一升，油价涨了吗"),
    ("movies", "List cinema showtimes in {c}.", "{C}电影排片", "which films are showing at cinemas in {c} tonight",
     "{C}今晚有什么电影"),
    ("dining", "Book a restaurant table in {c}.", "{C}餐厅订座", "reserve a table for dinner somewhere in {c}",
     "{C}帮我订个餐厅位子"),
    ("clinic", "Book a hospital appointment in {c}.", "{C}医院挂号", "get me a doctor appointment at a {c} hospital",
     "{C}帮我挂个医院的号"),
    ("library", "Show library opening hours in {c}.", "{C}图书馆开放时间", "when does the {c} library open",
     "{C}图书馆几点开门"),
    ("flights", "List flight departures from {c} airport.", "{C}航班起飞", "which flights leave {c} this afternoon",
     "{C}下午有哪些航班"),
    ("trains", "Search high-speed train tickets from {c}.", "{C}高铁票", "find me a train ticket out of {c}",
     "{C}出发的高铁还有票吗"),
    ("hotels", "Find hotel deals in {c}.", "{C}酒店特价", "cheap hotel for two nights in {c}", "{C}有便宜的酒店吗"),
    ("power", "Show planned power outages in {c}.", "{C}停电通知", "will the power be cut in {c} this week",
     "{C}这周会不会停电"),
    ("water", "Show water supply interruptions in {c}.", "{C}停水通知", "is the tap water going off in {c}",
     "{C}明天停水吗"),
    ("concerts", "Find concert tickets in {c}.", "{C}演唱会门票", "any concert in {c} I can still buy tickets for",
     "{C}最近演唱会还有票吗"),
    ("marathon", "Register for the marathon in {c}.", "{C}马拉松报名", "sign me up to run the {c} marathon",
     "{C}马拉松怎么报名参加"),
    ("rent", "Compare apartment rent prices in {c}.", "{C}房租行情", "what does renting a flat cost in {c}",
     "{C}租房子贵不贵，房租多少"),
    ("jobs", "Search job openings in {c}.", "{C}招聘信息", "who is hiring in {c}, any jobs", "{C}有什么工作招聘"),
]

SKILL_MD = """# {title}

{description}

## Risk Level
Low

## Parameters
```json
{parameters}
```

## Execute
```bash
echo ok
```
"""


def skills() -> list[tuple[str, str, str, str, str]]:
    """(name, title, description, request en, request zh) of the 1,000 skills."""
    out = []
    for r_slug, r_en, r_zh in ROOMS:
        for d_slug, d_en, d_zh in DEVICES:
            for a_slug, desc, title, ask_en, ask_zh in ACTIONS:
                fill = {"r": r_en, "d": d_en, "R": r_zh, "D": d_zh}
                out.append((f"{r_slug}_{d_slug}_{a_slug}", title.format(**fill), desc.format(**fill),
                            ask_en.format(**fill), ask_zh.format(**fill)))
    for c_slug, c_en, c_zh in CITIES:
        for k_slug, desc, title, ask_en, ask_zh in KINDS:
            fill = {"c": c_en, "C": c_zh}
            out.append((f"{c_slug}_{k_slug}", title.format(**fill), desc.format(**fill),
                        ask_en.format(**fill), ask_zh.format(**fill)))
    return out


def write(root: Path) -> list[str]:
    """Write the 1,000 skills under `root`; their names."""
    names = []
    for name, title, description, _, _ in skills():
        parameters = {"type": "object", "properties": {"detail": {"type": "string", "maxLength": 200,
                                                                  "description": "optional detail"}},
                      "additionalProperties": False}
        directory = root / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "SKILL.md").write_text(SKILL_MD.format(title=title, description=description,
                                                            parameters=json.dumps(parameters)), encoding="utf-8")
        names.append(name)
    return names


def requests() -> list[tuple[str, str]]:
    """200 labelled requests (text, the skill it names): every fifth skill, Chinese and English alternately."""
    out = []
    for i, (name, _, _, ask_en, ask_zh) in enumerate(skills()[::5]):
        out.append((ask_zh if i % 2 == 0 else ask_en, name))
    return out
