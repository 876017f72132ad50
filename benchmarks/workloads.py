"""Prompt sets of the end-to-end benchmark, written for this project (no outside data).

Five workloads of 32 distinct single-turn chats each (``[{"role": "user", "content": ...}]``,
rendered with the model's chat template by :mod:`vllm_specext.engine_run`):

* ``code_editing``: 4 Python modules (220–260 tokens) x 8 edit instructions;
* ``summarization``: 4 news-style articles (245–270 tokens) x 8 instructions;
* ``extraction``: 4 business documents (email, job posting, minutes, booking;
  340–410 tokens) x 8 extraction instructions;
* ``open_chat``: 32 everyday questions;
* ``code_generation``: 16 function specifications x {Python, JavaScript}.

Token counts are with the SmolLM2 tokenizer. People, companies, places and figures are
invented. Chats are ordered so that every prefix of a set mixes documents and
instructions: the first 4 chats use 4 different documents with 4 different instructions,
so ``WORKLOADS[name][:n]`` is a fair sample for small batches.
"""
from __future__ import annotations

Chat = list[dict[str, str]]

_CODE = [
    '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty, price):
        if name in self.items:
            self.items[name]["qty"] += qty
        else:
            self.items[name] = {"qty": qty, "price": price}

    def remove(self, name, qty):
        item = self.items[name]
        item["qty"] -= qty
        if item["qty"] <= 0:
            del self.items[name]

    def total_value(self):
        t = 0
        for n in self.items:
            t += self.items[n]["qty"] * self.items[n]["price"]
        return t

    def low_stock(self, limit=5):
        out = []
        for n, i in self.items.items():
            if i["qty"] < limit:
                out.append(n)
        return sorted(out)
''',
    '''import csv
from collections import defaultdict


def load_sales(path):
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            r["amount"] = float(r["amount"])
            rows.append(r)
    return rows


def sales_by_region(rows):
    totals = defaultdict(float)
    for r in rows:
        totals[r["region"]] += r["amount"]
    return dict(totals)


def top_products(rows, n=3):
    counts = {}
    for r in rows:
        p = r["product"]
        counts[p] = counts.get(p, 0) + r["amount"]
    ranked = sorted(counts.items(), key=lambda x: x[1])
    return ranked[:n]


def write_report(rows, out_path):
    with open(out_path, "w") as f:
        f.write("region,total\\n")
        for region, total in sales_by_region(rows).items():
            f.write(f"{region},{total:.2f}\\n")
''',
    '''import time
import urllib.request


def fetch(url, retries=3, delay=1.0):
    for attempt in range(retries):
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return resp.read().decode("utf-8")
        except Exception as e:
            print("attempt", attempt, "failed:", e)
            time.sleep(delay)
            delay = delay * 2
    return None


class RateLimiter:
    def __init__(self, per_second):
        self.interval = 1.0 / per_second
        self.last = 0.0

    def wait(self):
        now = time.monotonic()
        gap = now - self.last
        if gap < self.interval:
            time.sleep(self.interval - gap)
        self.last = time.monotonic()


def fetch_all(urls, per_second=2):
    limiter = RateLimiter(per_second)
    pages = {}
    for u in urls:
        limiter.wait()
        pages[u] = fetch(u)
    return pages
''',
    '''import re


def tokenize(text):
    return re.findall(r"[a-z']+", text.lower())


def word_counts(text):
    c = {}
    for w in tokenize(text):
        if w in c:
            c[w] = c[w] + 1
        else:
            c[w] = 1
    return c


def most_common(text, n=10, stop=None):
    stop = stop or set()
    c = word_counts(text)
    pairs = [(w, k) for w, k in c.items() if w not in stop]
    pairs.sort(key=lambda p: -p[1])
    return pairs[:n]


def average_sentence_length(text):
    s = [x for x in re.split(r"[.!?]+", text) if x.strip()]
    if len(s) == 0:
        return 0
    return sum(len(tokenize(x)) for x in s) / len(s)
''',
]

_EDITS = [
    "Add type hints to every function and method. Return the complete updated code.",
    "Add a short docstring to every function, method and class. Return the complete "
    "updated code.",
    "Rename the one- and two-letter variable names to descriptive names. Return the "
    "complete updated code.",
    "Find and fix any bugs in this code. Return the corrected code in full, then list what "
    "you changed.",
    "Add input validation that raises ValueError with a helpful message on bad arguments. "
    "Return the complete updated code.",
    "Replace the print calls with the logging module, or log the main steps if there are "
    "no print calls. Return the complete updated code.",
    "Simplify the loops with comprehensions or built-in functions where that keeps the code "
    "readable. Return the complete updated code.",
    "Add comments that explain the non-obvious lines. Keep the code otherwise unchanged and "
    "return all of it.",
]

_ARTICLES = [
    "Harbor City will replace 42 kilometres of lead water pipes over the next four years, "
    "the utility board announced on Monday. The 118-million-dollar programme, funded by a "
    "federal grant of 70 million and a rise in water rates of 3 percent a year, is the "
    "largest public works project in the city since the harbour bridge was built in 1987. "
    "About 9,400 homes still receive water through lead service lines, most of them in the "
    "Eastgate and Millbrook districts, where houses were built before 1950. Tests last year "
    "found lead above the federal action level in 6 percent of samples from those "
    "districts. The utility will start in Eastgate in April, replacing about 60 lines a "
    "week, and will pay for the part of the pipe on private land, which owners previously "
    "had to fund themselves. Residents will get a letter two weeks before work starts on "
    "their street and free water filters until their line is replaced. Council member Rosa "
    "Delgado, who pushed for the programme, called it \"overdue by a generation\". The "
    "ratepayers' association welcomed the plan but warned that the rate rise would hit "
    "low-income households hardest and asked the board to expand its discount scheme. The "
    "board said it would review the scheme in June.",

    "Lindqvist Software, a 230-person company in Uppsala, will keep the four-day working "
    "week it trialled for six months, its chief executive Maja Lindqvist said on Thursday. "
    "During the trial, staff worked 32 hours over four days for the same pay. The company "
    "measured output by the number of customer tickets closed and features shipped, and "
    "both stayed within 2 percent of the previous year's level. Sick days fell by 28 "
    "percent and only three employees left the company, compared with eleven in the same "
    "period a year earlier. Not every team benefited equally. The customer support team, "
    "which must answer calls five days a week, split into two rotas, and its manager said "
    "scheduling had become \"a weekly puzzle\". Some engineers said meetings had been "
    "squeezed into fewer days, leaving less time for focused work. The company will now ban "
    "internal meetings on Wednesday afternoons and hire four more support staff. "
    "Researchers at Uppsala University, who surveyed the staff before and after the trial, "
    "found that reported stress fell from 6.1 to 4.3 on a ten-point scale. They cautioned "
    "that a single company with young, well-paid staff says little about industries such "
    "as manufacturing or health care.",

    "A team at the University of Westmoor has found that honeybees exposed to low doses of "
    "a common fungicide take longer to find their way home. The researchers fitted 600 bees "
    "with radio tags weighing less than 3 milligrams and released them 800 metres from "
    "their hives. Bees that had been fed sugar water containing the fungicide at levels "
    "found in sprayed orchards took on average 41 minutes to return, against 26 minutes for "
    "untreated bees, and 18 percent of them never came back, against 7 percent. The "
    "fungicide is not meant to harm insects and is sprayed on apple and cherry trees during "
    "flowering, when bees are most active. Lead author Dr. Amara Okafor said the effect "
    "probably comes from the chemical disrupting the bees' energy metabolism rather than "
    "their sense of direction. The study, published in the Journal of Pollinator Ecology, "
    "was carried out over two summers at three sites. Farmers' groups pointed out that the "
    "doses in the experiment were at the upper end of what bees meet in the field. The team "
    "now plans to test whether spraying in the evening, when fewer bees fly, reduces the "
    "harm, and is working with two orchards that have agreed to change their spraying "
    "schedule next spring.",

    "Brightline Appliances reported a net profit of 48 million euros for the third "
    "quarter, down from 61 million a year earlier, as higher steel prices and weak demand "
    "for washing machines in southern Europe weighed on results. Revenue fell 4 percent to "
    "1.12 billion euros. The heat pump division was the exception: its sales rose 23 "
    "percent to 310 million euros, helped by subsidies in Germany and Poland, and it now "
    "makes up more than a quarter of group revenue. Chief financial officer Tomas Berg said "
    "the company had raised prices twice this year but could not pass on all of its higher "
    "costs. Brightline will close its oldest factory, in Lille, by the end of next year, "
    "moving production to plants in Poland and Spain; the move affects 540 jobs, and unions "
    "have called a strike for next Monday. The company kept its forecast for full-year "
    "revenue of 4.5 to 4.7 billion euros but cut its profit margin target from 6 percent to "
    "5 percent. It also announced a share buyback of up to 100 million euros. The shares "
    "fell 3.8 percent in morning trading in Paris.",
]

_SUMMARIES = [
    "Summarize this article in two sentences.",
    "Write a one-paragraph summary of this article for a busy executive.",
    "List the five most important points of this article as bullet points.",
    "Summarize this article in about 60 words.",
    "Write a headline for this article, then a three-sentence summary.",
    "Summarize this article, then list the questions it leaves unanswered.",
    "Explain what this article says to a twelve-year-old, in one short paragraph.",
    "Give a TL;DR of this article, followed by the key numbers it mentions and what each "
    "refers to.",
]

_DOCUMENTS = [
    """From: Priya Nair <priya.nair@greenleaf-cafe.com>
To: orders@valleyroasters.com
Date: 3 September 2024
Subject: Order change and delivery for Greenleaf Cafe

Hello Valley Roasters team,

Please change our standing order (customer number GC-2291) starting with the delivery on \
10 September. We would like 12 kg of the Ethiopia Yirgacheffe beans at 18.40 EUR per kg \
instead of 8 kg, and 6 kg of the house decaf at 15.90 EUR per kg instead of 4 kg. Please \
drop the Colombia blend completely. Our second shop at Kastanienallee 41, 10435 Berlin, opens \
on 16 September and needs its own delivery of 5 kg Yirgacheffe every Monday from then on; \
invoices for that shop should go to accounts@greenleaf-cafe.com. Could your driver arrive \
before 8:00? Our manager there, Jonas Weber (phone +49 30 5550 1822), will sign for the \
goods. Finally, last month's invoice INV-88314 charged us 245.60 EUR for a grinder service \
that was cancelled, so please issue a credit note.

Thanks,
Priya Nair
Operations Manager, Greenleaf Cafe, Oderberger Strasse 12, 10435 Berlin""",
    """Job posting: Senior Data Engineer (m/f/d)
Company: Nordlicht Energy GmbH, Hamburg
Reference: NE-2024-073
Start date: 1 November 2024 or later; apply by 15 October 2024.

Nordlicht Energy runs 38 wind farms in northern Germany and Denmark. Our analytics team of \
nine builds the data platform that forecasts power output and schedules maintenance. As a \
senior data engineer you will design pipelines that ingest 2 billion sensor readings a day, \
move our batch jobs from Hadoop to Spark on Kubernetes, and mentor two junior engineers. You \
report to Dr. Sofia Brandt, Head of Analytics.

Requirements: at least 5 years of experience with Python and SQL; production experience \
with Spark or Flink; good knowledge of Kubernetes and Terraform; fluent English (German is \
a plus).

We offer: a salary of 78,000 to 92,000 EUR a year, 30 days of holiday, up to 3 days of \
remote work a week, a 1,000 EUR yearly training budget and a company bicycle. Office: Am \
Sandtorkai 54, 20457 Hamburg.

Apply online with your CV and a short cover letter at careers.nordlicht-energy.de. \
Questions: Lena Hoffmann, recruiting, lena.hoffmann@nordlicht-energy.de, +49 40 555 7310.""",
    """Minutes: Maple Court Residents' Association, annual meeting
Date: 21 May 2024, 19:00 to 20:45, community room, 14 Maple Court, Leeds
Present: 23 households; chair Daniel Okoye; treasurer Helen Marsh; secretary Ravi Patel

1. Accounts. Helen Marsh reported an income of 8,460 GBP from fees and a spend of 7,115 \
GBP, leaving a reserve of 12,380 GBP. The accounts were approved unanimously.
2. Roof repair. Two quotes were received: 14,200 GBP from Hartley Roofing and 11,950 GBP \
from Pennine Builders. The meeting chose Pennine Builders; work will start on 8 July and \
take about three weeks. Each household will pay an extra 95 GBP, due by 30 June.
3. Bicycle storage. Ravi Patel will ask the council about a secure shelter for 20 bikes \
and report back by 15 June.
4. Garden day. A garden clean-up will take place on Saturday 8 June from 10:00; Anna \
Kowalski will organise tools and refreshments.
5. Elections. Daniel Okoye was re-elected as chair. Helen Marsh stands down in September; \
volunteers for treasurer should email secretary@maplecourt.org.uk.

Next meeting: 17 September 2024, 19:00, same room.""",
    """Booking confirmation
Booking reference: QX7-44M2
Guest: Mr. Kenji Tanaka, Tanaka Design Studio, kenji@tanaka-design.jp, +81 3 5555 0192
Event: European Product Design Summit 2024, 14-16 October 2024, Lisbon Congress Centre, \
Praca das Industrias 1, Lisbon

Registration: full conference pass (3 days), 1 x 890.00 EUR; workshop "Designing for \
Repair" on 13 October, 1 x 150.00 EUR.
Hotel: Hotel Miradouro, Rua da Prata 88, Lisbon. Check-in 13 October 2024 from 15:00, \
check-out 17 October 2024 by 11:00. Superior double room, 4 nights at 165.00 EUR per \
night, breakfast included.
Airport transfer: 13 October, arrival on flight TP 1349 at 12:35; driver meeting point at \
arrivals hall B; 45.00 EUR.
Total charged: 1,745.00 EUR to Visa card ending 4417 on 2 August 2024.

Cancellation: free until 13 September 2024; 50 percent of the total until 6 October; no \
refund after that. The hotel booking can be changed until 48 hours before check-in. \
Contact the organiser at help@epds-summit.eu or +351 21 555 8400 (Monday to Friday, 9:00 \
to 18:00 Lisbon time).""",
]

_EXTRACTIONS = [
    "Extract every person named in this text with their role and contact details, as a "
    "JSON list.",
    'Extract all dates and times in this text and what happens at each, as a JSON list of '
    'objects with the keys "date" and "event".',
    'Extract every amount of money in this text with what it is for, as a JSON list of '
    'objects with the keys "amount", "currency" and "purpose".',
    "List every organization, postal address, email address and phone number in this "
    "text, grouped by type.",
    "Extract the key facts of this text as a markdown table with the columns Field and "
    "Value.",
    "List every task or action this text asks someone to do, who must do it and by when, "
    "as JSON.",
    'Fill in this JSON from the text, with null for anything missing: {"document_type": '
    '"", "from": "", "to": "", "date": "", "reference": "", "total_amount": "", '
    '"deadline": ""}',
    "Extract every place mentioned in this text and say whether it is a city, a street "
    "address or a venue, as JSON.",
]

_QUESTIONS = [
    "I have a job interview for a junior accountant position next week. How should I "
    "prepare?",
    "What is the difference between weather and climate?",
    "Can you suggest a simple weekly meal plan for a busy vegetarian?",
    "Why is the sky blue? Please explain it simply.",
    "How do I politely decline an invitation to a friend's party?",
    "What are some good ways to stay focused when working from home?",
    "Explain what inflation is and why central banks care about it.",
    "I want to start running. How should a beginner plan the first month?",
    "What should I check when buying a used car?",
    "Write a short poem about autumn leaves.",
    "What are the pros and cons of electric cars?",
    "How can I improve my sleep?",
    "Tell me a surprising fact about octopuses and explain why it is true.",
    "What is the best way to learn a new language as an adult?",
    "How do vaccines train the immune system?",
    "Give me ideas for a birthday present for my grandmother, who loves gardening.",
    "How does a bill become law in a parliamentary democracy?",
    "What is the difference between a virus and a bacterium?",
    "I get nervous about public speaking. Do you have any tips?",
    "Explain how compound interest works, with an example.",
    "Which houseplants are easy to keep in a dark apartment?",
    "How do I make a budget when my income changes every month?",
    "Why does the Earth have seasons?",
    "Suggest a plan for a rainy weekend with two children aged six and nine.",
    "What is machine learning, in plain words?",
    "How should I store fresh herbs so that they last longer?",
    "Write a friendly note to a neighbour asking them to keep the noise down at night.",
    "What were the main causes of the French Revolution?",
    "How do noise-cancelling headphones work?",
    "What questions should I ask a landlord before renting a flat?",
    "How can I use less plastic at home?",
    "Explain the rules of chess to a complete beginner.",
]

_TASKS = [
    "checks whether a string is a palindrome, ignoring case, spaces and punctuation.",
    "merges two sorted lists into one sorted list without calling a sort function.",
    'parses a duration such as "1h30m15s" and returns the total number of seconds.',
    "returns the n-th Fibonacci number, computed iteratively.",
    "checks whether a string looks like a valid email address, using a regular expression.",
    "groups a list of words into lists of anagrams.",
    "converts a Roman numeral to an integer.",
    "flattens an arbitrarily nested list.",
    "counts the words in a text and returns the ten most frequent ones with their counts.",
    "performs binary search on a sorted list and returns the index of the target, or -1.",
    "computes the moving average of a list of numbers for a given window size.",
    "prints a table of temperatures from -10 to 40 degrees Celsius in steps of 5, with "
    "their Fahrenheit values.",
    "checks whether a 9x9 Sudoku grid (a list of rows, 0 for an empty cell) breaks any rule.",
    "removes duplicates from a list while keeping the original order.",
    'formats a number of bytes as a human-readable string such as "1.5 MB".',
    "finds the longest common prefix of a list of strings.",
]

_LANGUAGES = ["Python", "JavaScript"]


def _user(content: str) -> Chat:
    return [{"role": "user", "content": content}]


def _mixed(docs: list[str], instructions: list[str],
           template: str = "{instruction}\n\n{doc}") -> list[Chat]:
    """Every (instruction, document) pair as a chat: ``template`` filled with both.

    Chat ``i`` uses document ``i % D`` and instruction ``(i // D + i % D) % I``: each
    document meets every instruction once, and any ``D`` consecutive chats use ``D``
    different documents and (for ``D <= I``) different instructions.
    """
    d, n = len(docs), len(instructions)
    return [_user(template.format(instruction=instructions[(i // d + i % d) % n],
                                  doc=docs[i % d]))
            for i in range(d * n)]


#: workload name -> 32 distinct single-turn chats
WORKLOADS: dict[str, list[Chat]] = {
    "code_editing": _mixed(_CODE, _EDITS),
    "summarization": _mixed(_ARTICLES, _SUMMARIES),
    "extraction": _mixed(_DOCUMENTS, _EXTRACTIONS),
    "open_chat": [_user(q) for q in _QUESTIONS],
    "code_generation": _mixed(_TASKS, _LANGUAGES, "Write a {instruction} function that {doc} "
                              "Include a doc comment and a short usage example."),
}


def warmup_chats(n: int) -> list[Chat]:
    """``n`` synthetic chats (~330 tokens each, none from the workloads) that ask the model
    to copy a list: a benchmark runs them untimed at its batch size first, so that each
    engine has allocated and touched its memory for long prefills and for drafted steps
    (copying is drafted by every method) before anything is timed."""
    colors = ["red", "green", "blue", "amber", "violet", "silver", "coral", "olive"]
    animals = ["otter", "heron", "lynx", "gecko", "bison", "finch", "moose", "viper"]
    return [_user("Copy this list exactly, one item per line:\n" + "\n".join(
        f"Item {j}: {colors[(i + j) % 8]} {animals[(i * 3 + j) % 8]}, number {j * 7 + i}"
        for j in range(1, 31))) for i in range(n)]
