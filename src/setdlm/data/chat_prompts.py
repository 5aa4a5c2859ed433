"""Chat questions made offline from templates and subjects: prompts to self-distill a pretrained chat model on
(a drafter learns the model's own answers, docs/drafter.md) and held-out prompts to measure it on.

Every question is ``template.format(x=subject)``; the split of a (template, subject) pair is fixed by a hash of the
pair (about one in eight is ``"test"``), so the training prompts and the held-out ones never share a question,
whatever the count asked for. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import random

from ..errors import UserError

TEMPLATES = (
    "What is {x}?", "Explain {x} in simple terms.", "Give me three facts about {x}.",
    "Write a short poem about {x}.", "Why is {x} important?", "Describe {x} to a child.",
    "What are the advantages and disadvantages of {x}?", "Write a short story about {x}.",
    "How does {x} work?", "Give me some tips about {x}.", "What is the history of {x}?",
    "Write a haiku about {x}.", "Summarize what you know about {x} in two sentences.",
    "What are common misconceptions about {x}?", "How would you teach someone about {x}?",
    "List five words related to {x}.", "Write a tweet about {x}.", "What questions should I ask about {x}?",
    "Compare {x} with something similar.", "Tell me a fun fact about {x}.",
    "Write a product description for {x}.", "What is the future of {x}?", "Write a limerick about {x}.",
    "Can you explain the basics of {x}?", "What should a beginner know about {x}?",
    "Write an email to a friend about {x}.", "What are the main parts of {x}?",
    "Give an example of {x} in everyday life.", "Why do people like {x}?", "Write a riddle about {x}.",
)

SUBJECTS = (
    "the moon", "photosynthesis", "volcanoes", "the ocean", "gravity", "rainbows", "the internet", "bicycles",
    "coffee", "chess", "the human heart", "electricity", "music", "dinosaurs", "the solar system", "bees",
    "recycling", "democracy", "the weather", "friendship", "mountains", "trees", "the Roman Empire", "robots",
    "airplanes", "vaccines", "money", "libraries", "the brain", "sleep", "exercise", "bread", "rivers",
    "computers", "the printing press", "birds", "cats", "dogs", "gardening", "cooking pasta", "the alphabet",
    "time zones", "earthquakes", "the desert", "snow", "penguins", "the Eiffel Tower", "mathematics",
    "fractions", "prime numbers", "the water cycle", "climate change", "solar panels", "wind energy",
    "batteries", "smartphones", "email", "the pyramids", "olympic games", "football", "painting", "poetry",
    "the piano", "the violin", "honey", "chocolate", "tea", "the immune system", "bacteria", "DNA",
    "magnets", "light", "sound", "the stars", "black holes", "the Sahara", "rainforests", "coral reefs",
    "whales", "elephants", "butterflies", "ants", "the calendar", "maps", "trains", "cars", "bridges",
    "skyscrapers", "castles", "knights", "pirates", "the library card", "homework", "teachers", "hospitals",
    "doctors", "farming", "cheese", "apples", "bananas", "rice", "salt", "the color blue", "mirrors",
    "clocks", "umbrellas", "shoes", "the telephone", "radio", "television", "movies", "video games",
    "board games", "museums", "the Great Wall of China", "the Amazon river", "islands", "lighthouses",
    "the north pole", "ice cream", "birthdays", "holidays", "camping", "hiking", "swimming", "yoga",
    "meditation", "writing a resume", "public speaking", "learning a language", "saving money",
    "time management", "the scientific method", "programming", "Python", "databases", "passwords",
    "artificial intelligence", "the stock market", "inflation", "taxes", "voting", "newspapers",
)


def _split(template: str, subject: str) -> str:
    h = hashlib.sha256(f"{template}|{subject}".encode()).digest()[0]
    return "test" if h % 8 == 0 else "train"


def chat_questions(split: str, n: int | None = None, *, seed: int = 0) -> list[str]:
    """``n`` distinct questions of ``split`` ("train" or "test"; None: all of them), in a seeded order."""
    if split not in ("train", "test"):
        raise UserError(f"split must be 'train' or 'test', got {split!r}")
    pool = [t.format(x=s) for t in TEMPLATES for s in SUBJECTS if _split(t, s) == split]
    random.Random(seed).shuffle(pool)
    if n is not None and n > len(pool):
        raise UserError(f"asked for {n} {split} questions, there are {len(pool)}")
    return pool if n is None else pool[:n]
