"""Schemas and seeded message generators for bench_avro.py.

Four workloads, each with ASCII strings or with strings that are mostly not ASCII (names and
places in the scripts most of the world writes in):

- ``pyruhvro``: the record of pyruhvro's own benchmark (its repository's
  scripts/generate_avro.py): nullable name and age, an array of emails, an optional address
  record, a map of phone numbers, an optional preferences record, a 4-branch union
  ``["null", "string", "int", "boolean"]``, a long and a 3-symbol enum. Its generator draws each
  optional value with probability 1/2, 0-3 emails and phone numbers, one of the four union
  branches uniformly and a timestamp within the last year; ours does the same from word lists
  (no Faker), and writes ``created_at`` as an int, as the schema says.
- ``flat``: string, int, long, double, boolean, nullable string (~49 bytes a message).
- ``userdata`` and ``events``: ours (a Kafka-ish user profile; a Kafka-like event with uuid,
  timestamps, a date, a decimal, an enum, a nested record, an array, a map, nullable unions).

Messages are written with fastavro's ``schemaless_writer`` (the reference implementation), one
``bytes`` per message: what a Kafka client hands over.
"""

from __future__ import annotations

import datetime
import decimal
import io
import random
import uuid
from collections.abc import Callable
from typing import Any

import fastavro

PYRUHVRO = {
    "type": "record", "name": "User",
    "fields": [
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "age", "type": ["null", "int"], "default": None},
        {"name": "emails", "type": {"type": "array", "items": "string"}},
        {"name": "address", "type": ["null", {
            "type": "record", "name": "Address", "fields": [
                {"name": "street", "type": "string"},
                {"name": "city", "type": "string"},
                {"name": "zipcode", "type": "string"}]}], "default": None},
        {"name": "phone_numbers", "type": {"type": "map", "values": "string"}},
        {"name": "preferences", "type": ["null", {
            "type": "record", "name": "Preferences", "fields": [
                {"name": "contact_method", "type": ["null", "string"], "default": None},
                {"name": "newsletter", "type": "boolean"}]}], "default": None},
        {"name": "status", "type": ["null", "string", "int", "boolean"], "default": None},
        {"name": "created_at", "type": "long"},
        {"name": "class", "type": {"type": "enum", "name": "enum_col",
                                   "symbols": ["A", "B", "C"]}},
    ],
}

FLAT = {
    "type": "record", "name": "Flat", "namespace": "bench",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "count", "type": "int"},
        {"name": "at", "type": "long"},
        {"name": "price", "type": "double"},
        {"name": "active", "type": "boolean"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}

USERDATA = {
    "type": "record", "name": "UserData", "namespace": "bench",
    "fields": [
        {"name": "userId", "type": "string"},
        {"name": "age", "type": "int"},
        {"name": "fullName", "type": {"type": "record", "name": "FullName", "fields": [
            {"name": "firstName", "type": "string"}, {"name": "lastName", "type": "string"}]}},
        {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "phoneNumbers", "type": {"type": "array", "items": "string"}},
        {"name": "isPremiumMember", "type": "boolean"},
        {"name": "favoriteItems", "type": {"type": "map", "values": "int"}},
        {"name": "registrationDate",
         "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}

EVENTS = {
    "type": "record", "name": "Event", "namespace": "bench",
    "fields": [
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind",
                                  "symbols": ["VIEW", "CLICK", "BUY", "REFUND"]}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 12, "scale": 2}},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": "string"},
            {"name": "email", "type": ["null", "string"], "default": None}]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counters", "type": {"type": "map", "values": "long"}},
        {"name": "referrer", "type": ["null", "string"], "default": None},
        {"name": "score", "type": ["null", "double"], "default": None},
    ],
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "pyruhvro": PYRUHVRO, "flat": FLAT, "userdata": USERDATA, "events": EVENTS}

# A wide record (the small-batch table only): 200 fields cycling through long, nullable
# string, double, string, nullable long and boolean, as wide event or CDC tables have.
WIDE_TYPES: list[Any] = ["long", ["null", "string"], "double", "string", ["null", "long"],
                         "boolean"]
WIDE = {"type": "record", "name": "Wide", "namespace": "bench",
        "fields": [{"name": f"f{i}", "type": WIDE_TYPES[i % 6]} for i in range(200)]}

FIRST = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Leslie"]
LAST = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson"]
WORDS = ["red", "green", "blue", "sale", "new", "promo", "mobile", "web", "eu", "us", "beta"]
STREETS = ["Main Street", "Oak Avenue", "Elm Road", "Park Lane", "High Street", "Mill Way"]
CITIES = ["Springfield", "Riverside", "Fairview", "Georgetown", "Madison", "Clinton"]
# Not ASCII: Latin with diacritics, Greek, Cyrillic, Arabic, Devanagari, CJK, Hangul; 2-, 3-
# and a few 4-byte UTF-8 sequences, mixed with ASCII spaces and digits as real text is.
FIRST_U = ["Zoë", "José", "Łukasz", "Дмитрий", "Νίκος", "محمد", "अनिल", "太郎", "민준", "Søren"]
LAST_U = ["Müller", "García", "Wiśniewska", "Иванов", "Παπαδόπουλος", "الحسن", "शर्मा", "山田",
          "김", "Ørsted"]
WORDS_U = ["rouge", "vert", "größe", "новый", "προσφορά", "عرض", "नया", "新品", "할인", "🎉sale"]
STREETS_U = ["Hauptstraße", "Rue de l\u2019Église", "Невский проспект", "Οδός Ερμού", "銀座通り",
             "세종대로", "شارع النيل", "Ulica Łąkowa"]
CITIES_U = ["München", "Kraków", "Москва", "Αθήνα", "東京", "서울", "القاهرة", "São Paulo"]
EPOCH = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
YEAR_S = 365 * 24 * 3600


class Text:
    """Draws strings: ASCII only, or not ASCII with probability 0.9 per string."""

    def __init__(self, rng: random.Random, unicode: bool) -> None:
        self.rng = rng
        self.unicode = unicode

    def pick(self, ascii_pool: list[str], other_pool: list[str]) -> str:
        if self.unicode and self.rng.random() < 0.9:
            return self.rng.choice(other_pool)
        return self.rng.choice(ascii_pool)

    def first(self) -> str:
        return self.pick(FIRST, FIRST_U)

    def last(self) -> str:
        return self.pick(LAST, LAST_U)

    def word(self) -> str:
        return self.pick(WORDS, WORDS_U)

    def name(self) -> str:
        return f"{self.first()} {self.last()}"

    def email(self) -> str:
        return f"{self.first()}.{self.last()}@example.com".lower()

    def phone(self) -> str:
        return f"+1-555-{self.rng.randrange(10**7):07d}"


def pyruhvro_record(t: Text) -> dict[str, Any]:
    rng = t.rng
    half = rng.random
    return {
        "name": t.name() if half() < 0.5 else None,
        "age": rng.randint(18, 80) if half() < 0.5 else None,
        "emails": [t.email() for _ in range(rng.randint(0, 3))],
        "address": None if half() < 0.5 else {
            "street": f"{rng.randrange(1, 999)} {t.pick(STREETS, STREETS_U)}",
            "city": t.pick(CITIES, CITIES_U), "zipcode": f"{rng.randrange(10**5):05d}"},
        "phone_numbers": {t.word(): t.phone() for _ in range(rng.randint(0, 3))},
        "preferences": None if half() < 0.5 else {
            "contact_method": rng.choice([None, "email", "phone"]),
            "newsletter": half() < 0.5},
        "status": rng.choice([None, t.word(), rng.randint(0, 100), half() < 0.5]),
        "created_at": 1_700_000_000 + rng.randrange(YEAR_S),
        "class": rng.choice(["A", "B", "C"]),
    }


def flat_record(t: Text) -> dict[str, Any]:
    rng = t.rng
    return {
        "name": t.name(),
        "count": rng.randrange(-1000, 100_000),
        "at": 1_700_000_000_000 + rng.randrange(10**10),
        "price": round(rng.uniform(0, 1000), 2),
        "active": rng.random() < 0.5,
        "note": None if rng.random() < 0.3 else f"{t.word()} {t.word()} {t.word()}",
    }


def userdata_record(t: Text) -> dict[str, Any]:
    rng = t.rng
    first, last = t.first(), t.last()
    return {
        "userId": str(uuid.UUID(int=rng.getrandbits(128))),
        "age": rng.randrange(18, 90),
        "fullName": {"firstName": first, "lastName": last},
        "email": None if rng.random() < 0.2 else f"{first}.{last}@example.com".lower(),
        "phoneNumbers": [t.phone() for _ in range(rng.randrange(1, 4))],
        "isPremiumMember": rng.random() < 0.3,
        "favoriteItems": {f"{t.word()}{rng.randrange(1000)}": rng.randrange(100)
                          for _ in range(rng.randrange(3))},
        "registrationDate": EPOCH + datetime.timedelta(milliseconds=rng.randrange(10**10)),
    }


def event_record(t: Text) -> dict[str, Any]:
    rng = t.rng
    at = EPOCH + datetime.timedelta(microseconds=rng.randrange(10**13))
    return {
        "id": uuid.UUID(int=rng.getrandbits(128)),
        "at": at,
        "day": at.date(),
        "kind": rng.choice(["VIEW", "CLICK", "BUY", "REFUND"]),
        "amount": decimal.Decimal(rng.randrange(-10**8, 10**8)).scaleb(-2),
        "user": {"id": rng.randrange(10**12), "name": t.first(),
                 "email": None if rng.random() < 0.5 else "someone@example.com"},
        "tags": [t.word() for _ in range(rng.randrange(4))],
        "counters": {t.word(): rng.randrange(10**6) for _ in range(rng.randrange(3))},
        "referrer": None if rng.random() < 0.7 else "https://example.com/landing",
        "score": None if rng.random() < 0.5 else rng.random(),
    }


def wide_record(t: Text) -> dict[str, Any]:
    rng = t.rng
    make: list[Callable[[], Any]] = [
        lambda: rng.randrange(10**12), lambda: None if rng.random() < 0.3 else t.word(),
        rng.random, t.first, lambda: None if rng.random() < 0.5 else rng.randrange(1000),
        lambda: rng.random() < 0.5]
    return {f"f{i}": make[i % 6]() for i in range(200)}


RECORDS: dict[str, Callable[[Text], dict[str, Any]]] = {
    "pyruhvro": pyruhvro_record, "flat": flat_record, "userdata": userdata_record,
    "events": event_record, "wide": wide_record}


def records(schema: str, unicode: bool, n: int, seed: int = 5) -> list[dict[str, Any]]:
    """``n`` seeded records of ``schema`` (a key of SCHEMAS, or "wide")."""
    text = Text(random.Random(f"{seed}-{schema}-{unicode}"), unicode)
    make = RECORDS[schema]
    return [make(text) for _ in range(n)]


def messages(schema: dict[str, Any], rows: list[dict[str, Any]]) -> list[bytes]:
    """One schemaless Avro datum per record, written by fastavro."""
    parsed = fastavro.parse_schema(schema)
    out = []
    for row in rows:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, row)
        out.append(buffer.getvalue())
    return out

