"""Synthetic facts ("needles"): a statement hidden in a passage and the questions that ask for it.

Each :class:`FactFormat` belongs to one side. ``train`` formats are what training prompts (``find_value``)
may insert; ``eval`` formats — other fact kinds (passphrases, dates, person names, codes with letters, a
number with its unit) and other question wordings — appear only in evaluation, so an evaluation on them
measures whether a lookahead module learned retrieval rather than the training format. ``heldout`` formats
(multi-token personal names, badge codes) are evaluation-only too and, unlike ``eval`` ones, are never a
candidate for a training mix: a training lever chosen by looking at ``eval`` kinds is checked on them once.
:func:`formats` hands out one side and :func:`training_formats` the formats a training prompt source asks
for, refusing both other sides; tests check that no training prompt uses an ``eval`` or ``heldout``
statement or question.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Side = Literal["train", "eval", "heldout"]
SIDES: tuple[Side, ...] = ("train", "eval", "heldout")

#: Keys of the training prompts' facts; in-distribution needles reuse them, others take haystack words.
TRAIN_KEYS = (
    "apple", "harbor", "violet", "granite", "falcon", "meadow", "copper", "lantern", "orchid", "glacier",
    "saffron", "thunder", "willow", "compass", "ember", "quartz", "juniper", "cobalt", "maple", "nebula",
)  # fmt: skip
#: Keys of the many-source evaluation (:mod:`lkv.eval.tasks.generalise`): invented place names, so "the
#: Hollowmere bridge" reads as a name whatever the haystack; no training prompt uses them.
EVAL_KEYS = (
    "Aldermoor", "Brackenridge", "Calloway", "Dunmore", "Eastwick", "Fairhaven", "Glenrock", "Hollowmere",
    "Ironvale", "Kingsbury", "Larkspur", "Marlowe", "Northgate", "Oakhurst", "Pembrook", "Quarrydale",
    "Redcliffe", "Stonebridge", "Thornbury", "Umberfield", "Westmarch", "Yarrowby", "Ashcombe", "Birchwood",
    "Coldwater", "Drayton", "Elmstead", "Foxley", "Greywell", "Hartland", "Kestrelholm", "Lowther",
)  # fmt: skip
_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
_FIRST_NAMES = (
    "Marta", "Tobias", "Ingrid", "Rafael", "Ayesha", "Kenji", "Oluwaseun", "Beatriz", "Dmitri", "Fiona",
    "Lucien", "Priya", "Tomasz", "Yara", "Henrik", "Nadia", "Emeka", "Soren", "Camila", "Idris",
)  # fmt: skip
_LAST_NAMES = (
    "Okonkwo", "Lindqvist", "Ferreira", "Nakamura", "Kowalski", "Haddad", "Castellano", "Abernathy",
    "Varga", "Mbeki", "Thorsen", "Delacroix", "Petrov", "Quispe", "Halloran", "Rahimi", "Bergstrom",
)  # fmt: skip
_PASS_WORDS = (
    "amber", "falcon", "river", "tundra", "pepper", "lantern", "cactus", "mosaic", "walnut", "comet",
    "harbor", "velvet", "puzzle", "summit", "orchard", "kettle", "magnet", "prairie", "canyon", "beacon",
)  # fmt: skip
_COLOURS = (
    "crimson",
    "teal",
    "ochre",
    "indigo",
    "olive",
    "magenta",
    "silver",
    "turquoise",
    "maroon",
    "beige",
)
# Values of the word-valued training formats: places, two-word phrases and clock times, kinds that no
# evaluation-only format uses (those are passphrases, dates, person names and letter codes), so a module
# trained on them meets values that are not 7-digit numbers and is still measured on kinds it never saw.
_CITIES = (
    "Valparaiso", "Ulaanbaatar", "Trondheim", "Antananarivo", "Cartagena", "Samarkand", "Port Moresby",
    "Tallinn", "Montevideo", "Kampala", "Hobart", "Bergamo", "Marrakesh", "Yerevan", "Tbilisi", "Cusco",
    "Da Nang", "Reykjavik", "Windhoek", "Santa Cruz",
)  # fmt: skip
_FLAVOURS = ("smoked", "toasted", "candied", "pickled", "roasted", "dried", "crushed", "fermented")
_FOODS = (
    "fennel",
    "ginger",
    "paprika",
    "sesame",
    "tamarind",
    "cardamom",
    "anchovy",
    "lemon peel",
    "chestnut",
)
_CODE_LETTERS = "".join(c for c in string.ascii_uppercase if c not in "IO")  # no I/O: read as 1/0
_UNITS = ("kilograms", "litres", "millimetres", "kilowatts", "volts", "hectares", "newtons", "kilopascals")
# Ship names (the train-side multi-token name kind): an epithet, a bird or a sea word, sometimes a numeral;
# pools shared with no other format, so no word of a held-out personal name is trained on.
_SHIP_EPITHETS = (
    "Gallant", "Steadfast", "Radiant", "Restless", "Wandering", "Patient", "Distant", "Northern", "Silent",
    "Tireless",
)  # fmt: skip
_SHIP_NOUNS = (
    "Albatross", "Cormorant", "Meridian", "Tempest", "Petrel", "Endeavour", "Odyssey", "Heron", "Mariner",
    "Gannet",
)  # fmt: skip
_SHIP_NUMERALS = ("", "", " II", " III", " IV")
# Held-out personal names: pools shared with no other format, so a module never met any of their words.
_HELDOUT_FIRST = (
    "Ottilie", "Bartholomew", "Svetlana", "Cornelius", "Ngozi", "Evander", "Marisol", "Leopold",
    "Annika", "Thaddeus", "Zainab", "Percival", "Giulia", "Augustin", "Saoirse", "Casimir",
)  # fmt: skip
_HELDOUT_LAST = (
    "Vandermeer", "Okafor", "Szymanski", "Achterberg", "Fitzgerald", "Moreau", "Iwasaki", "Lindgren",
    "Valdivia", "Pemberton", "Kazantzakis", "Oyelaran", "Whitcombe", "Brannigan", "Esterhazy", "Tanaka",
)  # fmt: skip


def number_value(rng: random.Random) -> str:
    """A 7-digit number (the training prompts' and RULER's needle value)."""
    return str(rng.randrange(1_000_000, 10_000_000))


def passphrase_value(rng: random.Random) -> str:
    """Three distinct words joined by hyphens, e.g. ``walnut-comet-prairie``."""
    return "-".join(rng.sample(_PASS_WORDS, 3))


def date_value(rng: random.Random) -> str:
    """A date written out, e.g. ``March 14, 1987``."""
    return f"{rng.choice(_MONTHS)} {rng.randint(1, 28)}, {rng.randint(1850, 2020)}"


def name_value(rng: random.Random) -> str:
    """A first and last name, e.g. ``Marta Okonkwo``."""
    return f"{rng.choice(_FIRST_NAMES)} {rng.choice(_LAST_NAMES)}"


def letter_code_value(rng: random.Random) -> str:
    """A code of letters and digits, e.g. ``KX-4817-QB``."""
    letters = _CODE_LETTERS
    head = "".join(rng.choice(letters) for _ in range(2))
    tail = "".join(rng.choice(letters) for _ in range(2))
    return f"{head}-{rng.randrange(1000, 10000)}-{tail}"


def colour_value(rng: random.Random) -> str:
    """A colour word, e.g. ``teal``."""
    return rng.choice(_COLOURS)


def city_value(rng: random.Random) -> str:
    """A city, e.g. ``Port Moresby``."""
    return rng.choice(_CITIES)


def ingredient_value(rng: random.Random) -> str:
    """A two- or three-word ingredient, e.g. ``pickled lemon peel``."""
    return f"{rng.choice(_FLAVOURS)} {rng.choice(_FOODS)}"


def clock_value(rng: random.Random) -> str:
    """A clock time, e.g. ``9:35 pm``."""
    return f"{rng.randint(1, 12)}:{rng.randrange(0, 60, 5):02d} {rng.choice(('am', 'pm'))}"


def serial_code_value(rng: random.Random) -> str:
    """Two groups of four alternating digits and letters, e.g. ``7K2Q-X9R4`` (no run of letters reads as a
    word)."""

    def group() -> str:
        pools = [string.digits, _CODE_LETTERS]
        first = rng.randrange(2)
        return "".join(rng.choice(pools[(first + i) % 2]) for i in range(4))

    return f"{group()}-{group()}"


def iso_date_value(rng: random.Random) -> str:
    """A date in ISO form, e.g. ``2031-07-14`` (digits only: no month word, unlike :func:`date_value`)."""
    return f"{rng.randint(1950, 2049)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def measurement_value(rng: random.Random) -> str:
    """A number with one decimal and a unit written out, e.g. ``48.5 kilowatts``."""
    return f"{rng.randint(2, 999)}.{rng.randint(0, 9)} {rng.choice(_UNITS)}"


def ship_name_value(rng: random.Random) -> str:
    """A ship's name of two capitalised words, sometimes with a numeral, e.g. ``Steadfast Cormorant III``."""
    return f"{rng.choice(_SHIP_EPITHETS)} {rng.choice(_SHIP_NOUNS)}{rng.choice(_SHIP_NUMERALS)}"


def contact_name_value(rng: random.Random) -> str:
    """A first name, a middle initial and a last name, e.g. ``Ottilie R. Vandermeer`` (several tokens)."""
    return f"{rng.choice(_HELDOUT_FIRST)} {rng.choice(_CODE_LETTERS)}. {rng.choice(_HELDOUT_LAST)}"


def badge_code_value(rng: random.Random) -> str:
    """Letter, digit, two letters, a hyphen, two digits and a letter, e.g. ``H4PW-28K``."""
    letters, digits = _CODE_LETTERS, string.digits
    head = rng.choice(letters) + rng.choice(digits) + rng.choice(letters) + rng.choice(letters)
    return f"{head}-{rng.choice(digits)}{rng.choice(digits)}{rng.choice(letters)}"


@dataclass(frozen=True)
class FactFormat:
    """One kind of fact: a statement with ``{key}`` and ``{value}`` slots and the questions asking for it.

    Attributes:
        name: short id (the needle family of evaluation rows).
        statement: the sentence inserted into the passage.
        questions: questions with a ``{key}`` slot; the answer is the value.
        value: draws a value.
        side: ``train`` (training prompts may insert it), ``eval`` (evaluation only) or ``heldout``
            (evaluation only, and never a candidate for a training mix).
    """

    name: str
    statement: str
    questions: tuple[str, ...]
    value: Callable[[random.Random], str]
    side: Side


FACT_FORMATS: tuple[FactFormat, ...] = (
    # --- training formats (the first three are the original find_value facts) ---
    FactFormat(
        "magic_number",
        "The special magic number for {key} is {value}.",
        (
            "What is the special magic number for {key}? Answer with the number only.",
            "The text mentions a special magic number for {key}. What is it?",
            "Find the special magic number for {key} in the passage and reply with just the number.",
        ),
        number_value,
        "train",
    ),
    FactFormat(
        "passcode",
        "The secret passcode for {key} is {value}.",
        (
            "What is the secret passcode for {key}?",
            "Somewhere in the text there is a secret passcode for {key}. Reply with that passcode only.",
        ),
        number_value,
        "train",
    ),
    FactFormat(
        "vault_code",
        "Remember this: the access code of the {key} vault is {value}.",
        (
            "What is the access code of the {key} vault?",
            "Which number opens the {key} vault, according to the text?",
        ),
        number_value,
        "train",
    ),
    FactFormat(
        "room_number",
        "Note that the meeting about {key} takes place in room {value}.",
        (
            "In which room does the meeting about {key} take place?",
            "What room number is given for the {key} meeting?",
        ),
        number_value,
        "train",
    ),
    FactFormat(
        "colour",
        "By the way, the colour chosen for the {key} project is {value}.",
        (
            "Which colour was chosen for the {key} project?",
            "What colour does the text give for the {key} project?",
        ),
        colour_value,
        "train",
    ),
    FactFormat(
        "venue",
        "It was decided that the {key} conference will be held in {value}.",
        (
            "In which city will the {key} conference be held?",
            "Where does the text say the {key} conference takes place? Name the city.",
        ),
        city_value,
        "train",
    ),
    FactFormat(
        "ingredient",
        "The secret ingredient of the {key} stew is {value}.",
        (
            "What is the secret ingredient of the {key} stew?",
            "Which ingredient does the text name as the secret of the {key} stew?",
        ),
        ingredient_value,
        "train",
    ),
    FactFormat(
        "departure",
        "The last ferry to {key} leaves at {value}.",
        (
            "At what time does the last ferry to {key} leave?",
            "When does the last ferry to {key} leave, according to the text?",
        ),
        clock_value,
        "train",
    ),
    # --- evaluation-only formats: other fact kinds ---
    FactFormat(
        "passphrase",
        "The passphrase for the {key} account is {value}.",
        ("What is the passphrase for the {key} account?", "Tell me the {key} account's passphrase."),
        passphrase_value,
        "eval",
    ),
    FactFormat(
        "date",
        "The {key} agreement was signed on {value}.",
        (
            "On what date was the {key} agreement signed?",
            "When was the {key} agreement signed? Give the date.",
        ),
        date_value,
        "eval",
    ),
    FactFormat(
        "name",
        "The lighthouse keeper of {key} island is {value}.",
        (
            "Who is the lighthouse keeper of {key} island?",
            "Name the person who keeps the lighthouse on {key} island.",
        ),
        name_value,
        "eval",
    ),
    FactFormat(
        "letter_code",
        "The shipping label of the {key} parcel reads {value}.",
        (
            "What does the shipping label of the {key} parcel read?",
            "Give the code on the {key} parcel's label.",
        ),
        letter_code_value,
        "eval",
    ),
    # --- evaluation-only question wordings of the training statement ---
    # Direct requests in words no training question uses. Measured with FullKV on SmolLM2-135M (1K tokens,
    # essays and pydoc, seed 1): "Tell me ..." 6/6, "According to the passage ..." 5/6, against 5/6 for a
    # training wording. Wordings that put the key first as a label ("{key}: which special magic number ...",
    # 0/3) or ask indirectly ("I forgot ... Can you remind me?", 3/6; "Please look up ... and write it
    # down.", 3/6) made the full-cache model describe the text instead of answering, so they measured
    # instruction following rather than what eviction keeps.
    FactFormat(
        "magic_number_reworded",
        "The special magic number for {key} is {value}.",
        (
            "Tell me the special magic number that belongs to {key}.",
            "According to the passage, which special magic number goes with {key}?",
        ),
        number_value,
        "eval",
    ),
    # --- kinds for many-source evaluation (lkv.eval.tasks.generalise); two may train, the rest never ---
    FactFormat(
        "serial_code",
        "The serial number stamped on the {key} unit is {value}.",
        (
            "What is the serial number stamped on the {key} unit?",
            "Which serial number does the text give for the {key} unit?",
            "Read off the serial number of the {key} unit from the passage.",
        ),
        serial_code_value,
        "train",
    ),
    FactFormat(
        "iso_date",
        "The inspection of the {key} bridge is scheduled for {value}.",
        (
            "For which date is the inspection of the {key} bridge scheduled?",
            "When is the {key} bridge due for inspection? Give the date as written.",
            "What date does the passage give for the {key} bridge inspection?",
        ),
        iso_date_value,
        "train",
    ),
    FactFormat(
        "measurement",
        "The last reading of the {key} gauge was {value}.",
        (
            "What was the last reading of the {key} gauge? Give the number and its unit.",
            "How much did the {key} gauge show last time, according to the text?",
            "Report the {key} gauge's last reading, with the unit.",
        ),
        measurement_value,
        "eval",
    ),
    FactFormat(
        "contact_name",
        "The emergency contact for the {key} expedition is {value}.",
        (
            "Who is the emergency contact for the {key} expedition?",
            "Give the full name of the {key} expedition's emergency contact.",
            "Whom should one call in an emergency on the {key} expedition, according to the passage?",
        ),
        contact_name_value,
        "heldout",
    ),
    FactFormat(
        "badge_code",
        "The visitor badge issued to the {key} delegation carries the code {value}.",
        (
            "What code does the visitor badge of the {key} delegation carry?",
            "Which badge code was issued to the {key} delegation?",
            "Find the code on the {key} delegation's visitor badge.",
        ),
        badge_code_value,
        "heldout",
    ),
    # --- a multi-token name-like kind on the train side (lkv.labels.task_mix), apart from contact_name ---
    FactFormat(
        "ship_name",
        "The newest ship of the {key} line has been christened the {value}.",
        (
            "What is the newest ship of the {key} line called?",
            "Which name was given to the newest ship of the {key} line?",
            "Give the name of the {key} line's newest ship, as the text writes it.",
        ),
        ship_name_value,
        "train",
    ),
)


def formats(side: Side) -> tuple[FactFormat, ...]:
    """The fact formats of one side (``train``, ``eval`` or ``heldout``)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    return tuple(f for f in FACT_FORMATS if f.side == side)


def fact_format(name: str) -> FactFormat:
    """The fact format called ``name``."""
    for fmt in FACT_FORMATS:
        if fmt.name == name:
            return fmt
    raise ValueError(f"unknown fact format {name!r}; choose one of {', '.join(f.name for f in FACT_FORMATS)}")


def training_formats(names: Sequence[str]) -> list[FactFormat]:
    """The formats called ``names``, for a prompt source that trains: ``train`` side only.

    Raises:
        ValueError: no name, an unknown one, or one on the ``eval`` or ``heldout`` side (training prompts
            must not contain them, or their evaluation rows would be in-distribution).
    """
    if not names:
        raise ValueError("fact_formats must name at least one fact format")
    chosen = [fact_format(name) for name in names]
    untrained = [f.name for f in chosen if f.side != "train"]
    if untrained:
        raise ValueError(
            f"fact_formats {untrained} are evaluation-only (lkv.labels.facts side 'eval' or 'heldout'): training "
            f"prompts must not contain them; the train-side formats are {', '.join(f.name for f in formats('train'))}"
        )
    return chosen


def distinct_values(chosen: list[FactFormat], rng: random.Random) -> list[str]:
    """One value per fact, each drawn by its format, all different (a distractor must not share the asked
    value)."""
    values: list[str] = []
    for fmt in chosen:
        value = fmt.value(rng)
        while value in values:
            value = fmt.value(rng)
        values.append(value)
    return values
