from specdecode.core.tasks import TASKS, classify

LABELLED = [
    ("Write a Python function that merges two sorted lists.", "code"),
    ("Fix this bug:\n```js\nconst x = y +;\n```", "code"),
    ("Implement quicksort in Rust.", "code"),
    ("Solve for x: 3x + 5 = 20.", "math"),
    ("What is the probability of rolling two sixes with two dice?", "math"),
    ("Calculate 17% of 2400.", "math"),
    ("Return the result as JSON with fields name and age.", "structured-json"),
    ('{"tool": "search", "query": "weather in Paris"}', "structured-json"),
    ("Write an SQL query that counts orders per customer.", "sql"),
    ("SELECT name FROM users WHERE age > 30 -- optimise this", "sql"),
    ("Summarize the following article in three sentences: ...", "summarization"),
    ("TL;DR of this thread please: ...", "summarization"),
    ("Translate 'good morning, how are you' into French.", "translation"),
    ("Please translate this paragraph to German.", "translation"),
    ("Who was the first person to walk on the moon?", "qa"),
    ("Why is the sky blue?", "qa"),
    ("Explain how vaccines train the immune system.", "qa"),
    ("Write a short story about a lighthouse keeper.", "creative"),
    ("Compose a haiku about autumn rain.", "creative"),
    ("Pretend you are a pirate and greet me.", "creative"),
]


def test_labels_are_known():
    assert all(label in TASKS for _, label in LABELLED)


def test_classifier_labels_the_labelled_set():
    wrong = [(p, want, classify(p)) for p, want in LABELLED if classify(p) != want]
    assert not wrong, wrong


def test_anything_gets_a_label():
    assert classify("zzz") == "creative"
