#!/usr/bin/python3
"""Writes a WEB page set for `mtnlg data extract`: the page shapes of the open web.

    /usr/bin/python3 scripts/make-extract-web.py dev|heldout OUT_DIR

writes OUT_DIR/web-<set>.warc.gz and OUT_DIR/web-<set>_truth.jsonl (nothing is committed:
the tests and the benchmark generate the pages where they run). Two sets:

  * dev:     the pages the classifier's structure rules were tuned on;
  * heldout: the pages the numbers in docs/PERFORMANCE.md are measured on, never tuned on.

The sets are drawn from disjoint halves of every pool: sentence templates and their
fillers, the user-comment sentences, the non-English sentences, the boilerplate prose,
the semantic class names, the names in lists, the man page's options, the prefix and
alphabet of the hashed class names; some markup differs by set too (the news article's
wrapper, how comment sections are marked: only the held-out set has Disqus threads, the
order of the boxes of the boilerplate-heavy template); and another random seed.

14 templates, 16 pages each (12 English, 4 in German, French, Spanish, Russian, Chinese,
Japanese or Arabic; the English pages of a template come from two sites of 6 pages, the
others from two sites of 2, so site furniture repeats across a site's pages as it does in
a crawl; the pages are shuffled):

  news, blog (with comments), forum (a Q&A page or a threaded forum), docs, wiki, product
  (with reviews, specs, "customers also bought"), mailing (a list archive message), listing
  (headline links with one-line teasers), table (table layout of the early web), deflist
  (a glossary in <dl>), quotes (long blockquotes), manpage (the whole page in one <pre>),
  divsoup (nothing but <div>s with hashed class names), heavy (boilerplate prose -- cookie
  consent, about-us box, newsletter pitch, <noscript> notice, donation pitch -- longer
  than the article).

The gold main text (`text`) of each page follows docs/CURATION.md, "What is main text":
the article's title, prose, lists, tables, quotes and code; the question and its answers
of a Q&A page and every post of a forum thread; the message of a mailing-list page; a
listing page's intro only (its headlines and teasers are not main text; a listing page
without an intro has none); never navigation, bylines, dates, share bars, cookie and
consent text, newsletter and donation pitches, about-us boxes, <noscript> notices, user
cards, signatures, votes, prices, specs tables, product cards, pagers or footers. User
comments, comments under Q&A posts and product reviews are not main text either;
`text_with_comments` is the text with them (what --keep-comments gives).

Charsets: most pages UTF-8; the others in their language's legacy charset (windows-1252,
ISO-8859-1/15, KOI8-R, windows-1251, GBK, GB2312, Big5, Shift_JIS, EUC-JP, windows-1256),
declared in the HTTP header, in <meta>, in both or in neither. Some non-English sites
show their cookie banner in English (the banner must not decide the language).

Deterministic: the same bytes on every run for a set.
"""
import hashlib
import html as htmlmod
import json
import os
import random
import sys

from warc_writer import RecordIds, gz_member, warc_record

if len(sys.argv) != 3 or sys.argv[1] not in ("dev", "heldout"):
    sys.exit("usage: make-extract-web.py dev|heldout OUT_DIR")
SET = sys.argv[1]
OUT = sys.argv[2]
S = 0 if SET == "dev" else 1
rng = random.Random(5101 if S == 0 else 90317)


def half(pool):
    """This set's half of a pool."""
    return pool[S::2]


def esc(s):
    return htmlmod.escape(s, quote=False)


def pick(pool):
    return rng.choice(pool)


# --- English prose ---------------------------------------------------------------------------
PEOPLE = half(["Margit Olsen", "Tomasz Wierzbicki", "Aiyana Brooks", "Declan Murphy", "Priya Raman",
               "Hugo Lindqvist", "Nia Okafor", "Rafael Duarte", "Ingrid Solberg", "Kenji Arakawa", "Lucia Ferri",
               "Samuel Achterberg", "Fatima Idrissi", "Oskar Brandt", "Elena Petrova", "Wendell Carter",
               "Agnes Moreau", "Bartholomew Quist", "Chiara Benedetti", "Dmitri Volkov"])
ORGS = half(["the county water board", "the harbour authority", "the regional library", "the volunteer fire brigade",
             "the university hospital", "the transit cooperative", "the chamber of commerce",
             "the historical society", "the school district", "the rowing club", "the market association",
             "the city planning office", "the botanical trust", "the tenants' union"])
PLACES = half(["Elmstead", "Brackwater", "North Quay", "Harrow Vale", "Lindenfeld", "Saltmarsh", "Copper Hill",
               "Westbury", "the mill district", "Riverside", "Greyfriars", "Ashcombe", "Kestrel Bay", "Oldbridge"])
THINGS = half(["footbridge", "tram line", "reading room", "flood barrier", "community garden", "cycle path",
               "bus depot", "market hall", "swimming pool", "bell tower", "ferry landing", "archive",
               "skate park", "observatory"])
ADJS = half(["long-delayed", "controversial", "modest", "ambitious", "temporary", "popular", "crumbling",
             "newly restored", "underused", "expensive", "well-loved", "experimental"])
TIMES = half(["last spring", "since the autumn", "over the winter", "for almost a decade", "earlier this month",
              "before the election", "after the storm", "during the summer holidays", "in the nineties",
              "within a year"])
EN_SENTS = half([
    "{P} said that the {A} {N} in {L} would reopen {T}, although nobody had yet agreed on who would pay for it.",
    "Residents of {L} have complained about the {N} {T}, and {O} has promised to look into the matter.",
    "According to {O}, the {N} cost nearly twice as much as the original estimate.",
    "The plan for a {A} {N} was first proposed {T} by {P}, who still believes it was the right idea.",
    "Most of the people we spoke to in {L} were not against the {N} itself, only against the way it was decided.",
    "{P}, who has lived in {L} for thirty years, remembers when the {N} was the busiest place in town.",
    "It is not the first time that {O} has had to explain a delay of this kind to the people of {L}.",
    "The work on the {N} is expected to take another eighteen months, if the weather allows it.",
    "Critics point out that the {A} {N} in {L} is used by fewer than a hundred people on a normal day.",
    "In a statement published on Tuesday, {O} said it would hold a public meeting in {L} next month.",
    "When the {N} opened, it was considered one of the most modern of its kind in the whole country.",
    "{P} believes that a smaller {N} would have served {L} just as well and would have cost far less.",
    "The figures released by {O} show a steady rise in the number of visitors since the {N} was finished.",
    "Nobody disputes that {L} needed a new {N}; the argument is about where it should have been built.",
    "For the families who live next to the {N}, the noise of the building work has been the hardest part.",
    "{O} has set aside money for a study, but its results will not be known before the end of the year.",
    "Local shops in {L} say that their trade has fallen by a third {T}, and some of them blame the {N}.",
    "There is, as {P} put it, a difference between a good idea and a good plan, and the {N} was only the first.",
    "The council voted eleven to four in favour of the {A} {N}, after a debate that lasted until midnight.",
    "Anyone who wants to comment on the proposal can write to {O} until the end of the month.",
    "Older maps show that a {N} stood on the same spot in {L} more than a century ago.",
    "What surprised {P} most was how quickly the {N} became part of everyday life in {L}.",
    "Engineers from {O} inspected the {N} {T} and found that the foundations were in better shape than feared.",
    "Some of the money will come from a national fund, and the rest from a loan that {L} will repay over twenty years.",
    "The idea of turning the {N} into something else has come up again, and {P} is collecting signatures for it.",
    "A spokesperson for {O} would not say whether the {A} {N} would be finished on time.",
    "Children from the school in {L} painted the walls of the {N} during a week of workshops.",
    "The weekend opening hours of the {N} were cut {T}, which many older residents of {L} regret.",
    "Visitors who come to {L} by train can reach the {N} on foot in about ten minutes.",
    "If the plans go ahead, the {N} will be the third of its kind that {O} has built in the region.",
    "{P} has written to the newspaper many times, always about the same {N} and always with new arguments.",
    "It took three attempts and two changes of architect before the {N} in {L} finally got its permit.",
])


def en_sentence():
    s = pick(EN_SENTS).format(P=pick(PEOPLE), O=pick(ORGS), L=pick(PLACES), N=pick(THINGS), A=pick(ADJS),
                              T=pick(TIMES))
    return s[0].upper() + s[1:]


def en_par(lo=2, hi=4):
    return " ".join(en_sentence() for _ in range(rng.randint(lo, hi)))


EN_TITLES = half(["What the {A} {N} means for {L}", "{L} votes on the future of its {N}",
                  "Why the {N} in {L} is still closed", "A second look at the {N}", "The {N} that {L} almost lost",
                  "{O} and the {A} {N}", "Inside the {N} of {L}", "How {L} paid for its {N}",
                  "Letters about the {N}", "The {N}, ten years on"])


def en_title():
    t = pick(EN_TITLES).format(A=pick(ADJS), N=pick(THINGS), L=pick(PLACES), O=pick(ORGS))
    return t[0].upper() + t[1:]


# First-person user prose: comments, reviews, forum posts.
EN_USER = half([
    "I tried this in {L} last week and it worked exactly as described, thank you for taking the time to write it up.",
    "Honestly I am not convinced, the same thing happened to us with the {N} and nobody ever answered our letters.",
    "We have been waiting for a decent {N} for years, and I am glad that somebody finally wrote about it properly.",
    "My grandmother used to take me to the {N} in {L} every Sunday, so this brought back a lot of memories for me.",
    "Does anyone know whether the opening hours of the {N} will change again after the summer?",
    "Great article, but you forgot to mention that the old {N} was much cheaper to run.",
    "I work next to the {N} and I can tell you that the noise has not stopped for a single day {T}.",
    "This is the best explanation of the {N} I have found so far, and I have read most of what is out there.",
    "We bought one for the kitchen {T} and it still works like on the first day.",
    "The instructions could be clearer, it took me two evenings to figure out how to set it up in {L}.",
    "Arrived a day early and well packed, although the box was much bigger than it needed to be.",
    "After a month of daily use the handle started to wobble, which is a shame because {P} liked it otherwise.",
    "I had the same problem with the {N} and what fixed it for me was simply restarting the whole thing twice.",
    "Thanks, that was it, I would never have guessed that the setting was hidden in that menu.",
    "Not sure why people in {L} are so angry about this, it looks like a reasonable compromise to me.",
    "Is there a way to do this without asking {O} for permission first?",
])


def en_user_sentence():
    return pick(EN_USER).format(P=pick(PEOPLE), O=pick(ORGS), L=pick(PLACES), N=pick(THINGS), T=pick(TIMES))


def en_user(lo=1, hi=3):
    return " ".join(en_user_sentence() for _ in range(rng.randint(lo, hi)))


# --- other languages --------------------------------------------------------------------------
OTHER = {
    "de": half([
        "Der Gemeinderat hat am Dienstag beschlossen, die alte Brücke über den Fluss bis zum Herbst zu sanieren.",
        "Viele Anwohner hatten sich seit Jahren über den Lärm und den Zustand der Straße beschwert.",
        "Nach Angaben der Stadtverwaltung werden die Arbeiten etwa doppelt so teuer wie ursprünglich geplant.",
        "Die Bibliothek bleibt während der Umbauzeit geschlossen, die Ausleihe ist aber weiterhin online möglich.",
        "Wer Fragen zu dem Vorhaben hat, kann sich bis Ende des Monats schriftlich an das Bauamt wenden.",
        "Schon vor hundert Jahren stand an derselben Stelle eine kleine Markthalle aus Holz.",
        "Kritiker bemängeln, dass die Bürger zu spät und nur unvollständig informiert worden seien.",
        "Die Kinder der Grundschule haben die Wände des neuen Gebäudes in einer Projektwoche bemalt.",
        "Ein Teil des Geldes stammt aus einem Förderprogramm des Landes, der Rest wird über einen Kredit finanziert.",
        "Am Wochenende sind die Öffnungszeiten gekürzt worden, was vor allem ältere Besucher bedauern.",
        "Die Ingenieure stellten bei der Prüfung fest, dass das Fundament in besserem Zustand ist als befürchtet.",
        "Für die Familien, die direkt neben der Baustelle wohnen, war der Sommer besonders anstrengend.",
    ]),
    "fr": half([
        "Le conseil municipal a décidé mardi de rénover le vieux pont sur la rivière avant la fin de l'automne.",
        "De nombreux habitants se plaignaient depuis des années du bruit et de l'état de la chaussée.",
        "Selon la mairie, les travaux coûteront près de deux fois plus cher que ce qui avait été prévu.",
        "La bibliothèque restera fermée pendant les travaux, mais le prêt en ligne continue de fonctionner.",
        "Les personnes qui souhaitent donner leur avis peuvent écrire au service d'urbanisme jusqu'à la fin du mois.",
        "Il y a déjà cent ans, une petite halle en bois se trouvait exactement au même endroit.",
        "Les critiques estiment que la population a été informée trop tard et de manière incomplète.",
        "Les enfants de l'école primaire ont peint les murs du nouveau bâtiment pendant une semaine d'ateliers.",
        "Une partie de l'argent vient d'un programme régional, le reste sera financé par un emprunt sur vingt ans.",
        "Les horaires du week-end ont été réduits, ce que regrettent surtout les visiteurs les plus âgés.",
        "Les ingénieurs ont constaté que les fondations étaient en bien meilleur état que ce que l'on craignait.",
        "Pour les familles qui habitent juste à côté du chantier, l'été a été particulièrement difficile.",
    ]),
    "es": half([
        "El ayuntamiento decidió el martes restaurar el viejo puente sobre el río antes de que termine el otoño.",
        "Muchos vecinos llevaban años quejándose del ruido y del mal estado de la calle principal.",
        "Según el ayuntamiento, las obras costarán casi el doble de lo que se había calculado al principio.",
        "La biblioteca permanecerá cerrada durante las obras, aunque el préstamo por internet sigue funcionando.",
        "Quienes quieran opinar sobre el proyecto pueden escribir a la oficina de urbanismo hasta final de mes.",
        "Hace ya cien años había en el mismo lugar un pequeño mercado cubierto de madera.",
        "Los críticos opinan que la población fue informada demasiado tarde y de forma incompleta.",
        "Los niños de la escuela pintaron las paredes del nuevo edificio durante una semana de talleres.",
        "Una parte del dinero procede de un programa regional y el resto se pagará con un préstamo a veinte años.",
        "El horario de los fines de semana se ha reducido, algo que lamentan sobre todo los visitantes mayores.",
        "Los ingenieros comprobaron que los cimientos estaban en mucho mejor estado de lo que se temía.",
        "Para las familias que viven junto a las obras, el verano ha sido especialmente duro.",
    ]),
    "ru": half([
        "Городской совет во вторник решил отремонтировать старый мост через реку до конца осени.",
        "Многие жители уже несколько лет жаловались на шум и плохое состояние дороги.",
        "По словам представителей мэрии, работы обойдутся почти вдвое дороже, чем планировалось.",
        "Библиотека будет закрыта на время ремонта, но книги по-прежнему можно заказать через интернет.",
        "Все, у кого есть вопросы о проекте, могут написать в управление строительства до конца месяца.",
        "Ещё сто лет назад на этом самом месте стоял небольшой деревянный рынок.",
        "Критики считают, что жителей проинформировали слишком поздно и не полностью.",
        "Дети из начальной школы расписали стены нового здания во время недели творческих занятий.",
        "Часть денег поступит из областной программы, остальное город возьмёт в кредит на двадцать лет.",
        "Часы работы в выходные сократили, о чём особенно жалеют пожилые посетители.",
        "Инженеры установили, что фундамент находится в гораздо лучшем состоянии, чем опасались.",
        "Для семей, которые живут рядом со стройкой, это лето оказалось особенно тяжёлым.",
    ]),
    "zh": half([
        "市议会周二决定在今年秋天结束之前修复横跨河流的那座老桥。",
        "许多居民多年来一直抱怨街道的噪音和路面的糟糕状况。",
        "据市政府介绍，这项工程的费用将比最初的预算高出将近一倍。",
        "图书馆在施工期间将暂时关闭，但读者仍然可以通过网络预约借书。",
        "对这个项目有疑问的市民可以在本月底之前写信给城市规划部门。",
        "早在一百年前，同一个地方就有一座小小的木结构市场。",
        "批评者认为，市民得到通知的时间太晚，而且信息也不完整。",
        "小学的孩子们在一周的手工活动中为新大楼的墙壁画上了图画。",
        "一部分资金来自省里的扶持计划，其余部分将通过一笔二十年的贷款解决。",
        "周末的开放时间被缩短了，这让不少年纪较大的游客感到遗憾。",
        "工程师在检查后发现，地基的状况比人们担心的要好得多。",
        "对于住在工地旁边的家庭来说，这个夏天过得格外辛苦。",
    ]),
    "ja": half([
        "市議会は火曜日、川に架かる古い橋を今年の秋までに改修することを決めました。",
        "多くの住民が、何年も前から騒音と道路の傷みについて苦情を寄せていました。",
        "市役所によると、工事の費用は当初の見積もりのほぼ二倍になる見込みです。",
        "図書館は工事の間閉館しますが、インターネットでの貸し出しの予約は引き続き利用できます。",
        "計画について意見のある人は、今月末まで都市計画課に手紙で意見を送ることができます。",
        "百年前にも、まったく同じ場所に木造の小さな市場が建っていました。",
        "批判的な人たちは、住民への説明が遅すぎて、しかも不十分だったと指摘しています。",
        "小学校の子どもたちは、一週間のワークショップで新しい建物の壁に絵を描きました。",
        "費用の一部は県の補助金でまかなわれ、残りは二十年の借入金で支払われる予定です。",
        "週末の開館時間が短くなり、特に年配の利用者からは残念がる声が上がっています。",
        "技術者が調べたところ、基礎の状態は心配されていたよりもずっと良いことがわかりました。",
        "工事現場のすぐ隣に住む家族にとって、この夏は特につらいものになりました。",
    ]),
    "ar": half([
        "قرر المجلس البلدي يوم الثلاثاء ترميم الجسر القديم فوق النهر قبل نهاية فصل الخريف.",
        "اشتكى كثير من السكان منذ سنوات من الضجيج ومن سوء حالة الشارع الرئيسي.",
        "وبحسب البلدية فإن تكلفة الأشغال ستكون ضعف ما كان مقدرا في البداية تقريبا.",
        "ستبقى المكتبة مغلقة خلال فترة الأشغال لكن الإعارة عبر الإنترنت ما زالت متاحة.",
        "يمكن لكل من لديه أسئلة حول المشروع أن يكتب إلى مكتب التخطيط حتى نهاية الشهر.",
        "قبل مئة عام كان في المكان نفسه سوق خشبي صغير يقصده الناس من القرى المجاورة.",
        "يرى المنتقدون أن السكان أبلغوا في وقت متأخر جدا وبصورة غير كاملة.",
        "رسم أطفال المدرسة الابتدائية على جدران المبنى الجديد خلال أسبوع من الورشات.",
        "يأتي جزء من المال من برنامج جهوي أما الباقي فسيمول بقرض على عشرين سنة.",
        "تم تقليص ساعات العمل في عطلة نهاية الأسبوع وهو ما يأسف له الزوار المسنون خاصة.",
        "وجد المهندسون أن حالة الأساسات أفضل بكثير مما كان يخشى الجميع.",
        "كان هذا الصيف صعبا بشكل خاص على العائلات التي تسكن بجوار ورشة البناء.",
    ]),
}
OTHER_TITLES = {
    "de": ["Die Zukunft der alten Brücke", "Neue Pläne für die Markthalle", "Bibliothek schließt für ein Jahr"],
    "fr": ["L'avenir du vieux pont", "De nouveaux projets pour la halle", "La bibliothèque ferme pour un an"],
    "es": ["El futuro del puente viejo", "Nuevos planes para el mercado", "La biblioteca cierra durante un año"],
    "ru": ["Будущее старого моста", "Новые планы для рынка", "Библиотека закрывается на год"],
    "zh": ["老桥的未来", "市场的新计划", "图书馆将关闭一年"],
    "ja": ["古い橋のこれから", "市場の新しい計画", "図書館が一年間休館へ"],
    "ar": ["مستقبل الجسر القديم", "خطط جديدة للسوق", "المكتبة تغلق لمدة عام"],
}
SEP = {"zh": "", "ja": ""}
CHARSETS = {"en": ["windows-1252", "iso-8859-1"], "de": ["iso-8859-15", "windows-1252"],
            "fr": ["windows-1252", "iso-8859-1"], "es": ["iso-8859-1", "windows-1252"],
            "ru": ["koi8-r", "windows-1251"], "zh": ["gbk", "gb18030"] if S == 0 else ["gb2312", "big5"],
            "ja": ["shift_jis", "euc-jp"], "ar": ["windows-1256", "utf-8"]}
LANGS = ["de", "fr", "es", "ru", "zh", "ja", "ar"]


def par(lang, lo=2, hi=4):
    if lang == "en":
        return en_par(lo, hi)
    return SEP.get(lang, " ").join(pick(OTHER[lang]) for _ in range(rng.randint(lo, hi)))


def sentence(lang):
    return en_sentence() if lang == "en" else pick(OTHER[lang])


def title(lang):
    return en_title() if lang == "en" else pick(OTHER_TITLES[lang])


def user(lang, lo=1, hi=3):
    if lang == "en":
        return en_user(lo, hi)
    # replies often open with the name they answer
    return f"@{pick(PEOPLE).split()[0]} " + par(lang, max(lo, 2), max(hi, 2))


# --- boilerplate prose (a site's; English, or the page's language) ---------------------------
BOILER = {
    "cookie": half([
        "We use cookies and similar technologies to give you the best possible experience on our website, to analyse how it is used and to show you content and advertising that may interest you. Some of these cookies are necessary for the site to work, others help us improve it. By clicking accept you agree that we and our partners may store and access information on your device.",
        "This website stores cookies on your computer. These cookies are used to collect information about how you interact with our website and allow us to remember you. We use this information in order to improve and customise your browsing experience and for analytics about our visitors, both on this website and other media. To find out more about the cookies we use, see our privacy policy.",
        "Your privacy is important to us. We and our trusted partners use technologies such as cookies to store and read information on your device, to personalise the content and the adverts you see, to measure how well they work and to understand our audience. You can change your mind at any time by returning to this page and changing your choices.",
        "We value your privacy and want to be open about the data we collect. With your permission we would like to use cookies to remember your settings, to understand how you use the site and to make the advertising you see more relevant to you. You can accept all of them, refuse the ones that are not essential, or choose which ones you allow.",
    ]),
    "about": half([
        "The Courier has been the independent voice of the valley since 1911. We are owned by a small trust of readers and employees, and every story we publish is written by people who live in the towns we cover. We believe that local journalism matters and that a community is stronger when it knows what is happening in it.",
        "We are a small team of writers and editors who believe that good reporting should be free for everyone to read. Our work is paid for by the readers who support us every month, and we do not answer to any owner or advertiser. If you like what we do, tell your friends about us.",
        "Founded by a group of neighbours who were tired of reading only press releases, this site has grown into one of the most read sources of local news in the region. We are proud that our reporters still walk to most of the places they write about.",
        "This magazine is written and edited by volunteers who care about the places where they live. We have been publishing for more than twenty years, first on paper and now online, and we are always looking for people who would like to join us and write.",
    ]),
    "newsletter": half([
        "Get the best of our reporting delivered to your inbox every morning. Our editors pick the stories that matter most to you and your neighbours, with no spam and no advertising, and you can unsubscribe at any time with a single click at the bottom of every email.",
        "Never miss a story again. Sign up for our weekly newsletter and receive a short summary of everything that happened in your town this week, together with the dates of the events that are coming up and a few recommendations from our team.",
        "Join more than forty thousand readers who start their day with our free morning briefing. It takes five minutes to read, it covers everything from the council to the football club, and we promise that we will never share your address with anybody else.",
        "Would you like to hear about new articles as soon as they are published? Leave us your email address and we will send you a short note whenever something new appears on the site, never more than once a day and never anything else.",
    ]),
    "noscript": half([
        "It looks like your browser does not have JavaScript enabled or is blocking it. Parts of this website, such as the comments, the photo galleries and the search, will not work correctly without it. Please enable JavaScript in the settings of your browser and reload this page to get the full experience.",
        "For the best experience on this site you need to turn on JavaScript in your browser. Without it some of the features that make reading easier, like the table of contents and the dark mode, are not available, and some pages may look broken or be impossible to use.",
    ]),
    "donate": half([
        "Quality journalism takes time, money and hard work to produce. Unlike many others we have not put up a paywall, because we believe that everybody should be able to read the news that affects their life. If you are able to, please consider supporting us with a small monthly contribution today.",
        "Before you go, we have a small favour to ask. More people are reading our reporting than ever, but advertising revenue is falling fast. Every contribution, however big or small, helps us keep our journalism open to everyone and independent of any political or commercial interest.",
        "If you have read this far, you probably care about the same things we do. We rely on readers like you to keep going, and even the price of a cup of coffee each month makes a real difference to a small newsroom like ours. Thank you for considering it.",
        "This article was free to read, and we would like to keep it that way for as long as we can. That is only possible because some of our readers choose to support us. If you value what we do, please think about becoming one of them today.",
    ]),
}
BOILER_OTHER = {
    "de": "Wir verwenden Cookies und ähnliche Technologien, um Ihnen die bestmögliche Nutzung unserer Website zu ermöglichen, um zu analysieren, wie sie genutzt wird, und um Ihnen Inhalte und Werbung anzuzeigen, die Sie interessieren könnten. Mit einem Klick auf Akzeptieren stimmen Sie dem zu.",
    "fr": "Nous utilisons des cookies et des technologies similaires pour vous offrir la meilleure expérience possible sur notre site, pour analyser son utilisation et pour vous proposer des contenus et des publicités adaptés à vos centres d'intérêt. En cliquant sur accepter, vous donnez votre accord.",
    "es": "Utilizamos cookies y tecnologías similares para ofrecerle la mejor experiencia posible en nuestro sitio, para analizar cómo se utiliza y para mostrarle contenidos y publicidad que puedan interesarle. Al hacer clic en aceptar, usted acepta su uso.",
    "ru": "Мы используем файлы cookie и похожие технологии, чтобы сделать работу с сайтом удобнее, анализировать его посещаемость и показывать вам интересные материалы и рекламу. Нажимая кнопку принять, вы соглашаетесь с этим.",
    "zh": "我们使用Cookie和类似技术来为您提供最佳的网站体验，分析网站的使用情况，并向您展示您可能感兴趣的内容和广告。点击接受即表示您同意我们使用这些技术。",
    "ja": "当サイトでは、より良いサービスを提供し、サイトの利用状況を分析し、お客様に合ったコンテンツや広告を表示するためにクッキーを使用しています。同意するをクリックすると、クッキーの使用に同意したことになります。",
    "ar": "نستخدم ملفات تعريف الارتباط وتقنيات مشابهة لنقدم لك أفضل تجربة ممكنة على موقعنا ولتحليل طريقة استخدامه ولعرض محتوى وإعلانات قد تهمك. بالضغط على قبول فإنك توافق على ذلك.",
}

# --- class names ------------------------------------------------------------------------------
SEMANTIC = {
    "header": half(["site-header", "masthead", "top-bar", "page-header", "global-header", "header-wrap"]),
    "nav": half(["main-nav", "primary-menu", "navbar", "menu-main", "site-navigation", "topnav"]),
    "main": half(["content", "main-content", "page-content", "site-main", "content-area", "primary"]),
    "article": half(["article-body", "entry-content", "post-content", "story-body", "post-body", "article-text"]),
    "sidebar": half(["sidebar", "widget-area", "secondary", "rail", "side-column", "sidebar-right"]),
    "footer": half(["site-footer", "footer", "page-footer", "colophon", "footer-wrap", "global-footer"]),
    "cookie": half(["cookie-notice", "cc-window", "consent-banner", "gdpr-popup", "onetrust-banner-sdk",
                    "cookie-bar"]),
    "comments": half(["comments", "comment-list", "commentlist", "comments-area", "discussion", "responses"]),
    "comment": half(["comment", "comment-body", "comment-item", "reply", "comment-content", "response"]),
    "reviews": half(["reviews", "customer-reviews", "review-list", "ratings-reviews", "product-reviews",
                     "bewertungen"]),
    "review": half(["review", "review-item", "customer-review", "review-card", "review-body", "rating-entry"]),
    "related": half(["related-posts", "more-stories", "related", "also-bought", "recommended", "more-from"]),
    "newsletter": half(["newsletter-signup", "subscribe-box", "newsletter", "signup-cta", "email-capture",
                        "newsletter-widget"]),
    "about": half(["about-box", "site-about", "about-us", "who-we-are", "about-widget", "intro-box"]),
    "donate": half(["support-us", "donation-ask", "contribute", "membership-cta", "support-box", "epic"]),
    "share": half(["share-bar", "social-share", "sharing", "share-tools", "social-links", "share"]),
    "byline": half(["byline", "post-meta", "article-meta", "entry-meta", "meta", "author-info"]),
}
HASH_PREFIX = ["css-", "jsx-"] if S == 0 else ["sc-", "_"]
HASH_ALPHA = "abcdefghijklm0123456789" if S == 0 else "nopqrstuvwxyzABCDEF"


class Site:
    def __init__(self, host, lang, style):
        self.host, self.lang, self.style = host, lang, style  # style: semantic | hashed
        self.hashes = {}
        self.names = {k: pick(v) for k, v in SEMANTIC.items()}
        self.boiler = {k: pick(v) for k, v in BOILER.items()}
        self.cookie_lang = "en" if lang == "en" or rng.random() < 0.5 else lang
        self.cookie_at_end = rng.random() < 0.5
        self.nav = [pick(["Home", "News", "Sport", "Culture", "Opinion", "Weather", "Events", "Contact", "About",
                          "Archive", "Business", "Travel", "Podcasts", "Jobs"]) for _ in range(rng.randint(5, 9))]
        self.name = pick(["The Valley Courier", "Harbour Gazette", "Northern Ledger", "The Quayside",
                          "Lindenfeld Post", "Westbury Herald", "Copper Hill Chronicle", "The Ashcombe Review"])

    def c(self, role):
        """The class attribute of a role."""
        if self.style == "hashed":
            if role not in self.hashes:
                self.hashes[role] = pick(HASH_PREFIX) + "".join(rng.choice(HASH_ALPHA) for _ in range(6))
            return f' class="{self.hashes[role]}"'
        return f' class="{self.names.get(role, role)}"'


def cookie_html(site):
    text = site.boiler["cookie"] if site.cookie_lang == "en" else BOILER_OTHER[site.cookie_lang]
    attrs = site.c("cookie")
    if site.style == "hashed" and rng.random() < 0.5:
        attrs += ' role="dialog" aria-label="Cookie consent"'
    btn = "Accept all" if site.cookie_lang == "en" else "OK"
    return f"<div{attrs}><p>{esc(text)}</p><button>{btn}</button><a href=\"/privacy\">Privacy policy</a></div>"


def header_html(site):
    links = "".join(f'<li><a href="/{n.lower()}">{n}</a></li>' for n in site.nav)
    if site.style == "hashed":
        return (f'<div{site.c("header")}><div{site.c("logo")}><a href="/">{esc(site.name)}</a></div>'
                f'<div{site.c("nav")}><ul>{links}</ul></div></div>')
    wrap = pick(["header", "div"])
    return f'<{wrap}{site.c("header")}><a href="/" class="logo">{esc(site.name)}</a><nav{site.c("nav")}><ul>{links}</ul></nav></{wrap}>'


def sidebar_html(site):
    items = "".join(f'<li><a href="/story/{rng.randint(1000, 9999)}">{esc(title(site.lang))}</a></li>' for _ in range(5))
    head = "Most read" if site.lang == "en" else "Top"
    tag = "aside" if site.style == "semantic" and rng.random() < 0.5 else "div"
    return f'<{tag}{site.c("sidebar")}><h3>{head}</h3><ul>{items}</ul></{tag}>'


def footer_html(site):
    links = " | ".join(f'<a href="/{w.lower()}">{w}</a>' for w in ["Imprint", "Privacy", "Terms", "Contact", "Careers"])
    tag = "footer" if site.style == "semantic" else "div"
    return f'<{tag}{site.c("footer")}><p>{links}</p><p>&copy; 2024 {esc(site.name)}. All rights reserved.</p></{tag}>'


def page(site, ttl, body, lang_attr=True, head_extra=""):
    lang = f' lang="{site.lang}"' if lang_attr else ""
    dir_ = ' dir="rtl"' if site.lang == "ar" else ""
    cookie = cookie_html(site)
    pre, post = ("", cookie) if site.cookie_at_end else (cookie, "")
    return (f"<!DOCTYPE html><html{lang}{dir_}><head><meta charset=\"{{CHARSET}}\">{head_extra}<title>{esc(ttl)} - "
            f"{esc(site.name)}</title><script>window.dataLayer=[];function gtag(){{dataLayer.push(arguments)}}</script>"
            f"<style>.x{{color:red}}</style></head><body>{pre}{header_html(site)}{body}{footer_html(site)}{post}"
            f"<script src=\"/js/app.{rng.randint(1000, 9999)}.js\"></script></body></html>")


def byline(site):
    who = pick(PEOPLE)
    return (f'<div{site.c("byline")}>By <a href="/author/{who.split()[0].lower()}">{who}</a> '
            f'<time datetime="2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}">{rng.randint(1, 28)} May 2024</time></div>')


def share(site):
    return f'<div{site.c("share")}><a href="#">Share</a> <a href="#">Tweet</a> <a href="#">Email</a></div>'


class Gold:
    def __init__(self):
        self.lines, self.comments = [], []

    def add(self, *lines):
        self.lines += [l for l in lines if l]
        self.comments += [l for l in lines if l]

    def comment(self, *lines):
        self.comments += [l for l in lines if l]


def paragraphs(site, g, n, lo=2, hi=4, wrap="p"):
    out = ""
    for _ in range(n):
        t = par(site.lang, lo, hi)
        g.add(t)
        out += f"<{wrap}>{esc(t)}</{wrap}>"
    return out


# --- the templates ----------------------------------------------------------------------------
def t_news(site, g):
    ttl = title(site.lang)
    g.add(ttl)
    body = paragraphs(site, g, rng.randint(3, 6))
    if rng.random() < 0.5:
        sub = sentence(site.lang)[:40]
        g.add(sub)
        body += f"<h2>{esc(sub)}</h2>" + paragraphs(site, g, 2)
    related = "".join(f'<li><a href="/s/{rng.randint(1, 999)}">{esc(title(site.lang))}</a></li>' for _ in range(4))
    wrap = "article" if S == 0 or rng.random() < 0.5 else "div"
    main = (f'<main{site.c("main")}><{wrap}><h1>{esc(ttl)}</h1>{byline(site)}{share(site)}<div{site.c("article")}>{body}</div>'
            f'<div{site.c("related")}><h3>Read more</h3><ul>{related}</ul></div></{wrap}></main>')
    return ttl, main + sidebar_html(site)


def comments_section(site, g, n, kind="comment"):
    items = ""
    mark = rng.randint(0, 2) if S == 0 else rng.choice([0, 1, 3])
    for k in range(n):
        who = pick(PEOPLE)
        t = user(site.lang)
        g.comment(t)
        attrs = site.c(kind)
        if mark == 1:
            attrs += ' itemprop="comment" itemscope itemtype="https://schema.org/Comment"'
        items += (f'<li{attrs} id="{kind}-{rng.randint(100, 99999)}"><div><b>{who}</b> <span>{rng.randint(2, 23)} hours ago</span></div>'
                  f'<div><p>{esc(t)}</p></div><a href="#reply">Reply</a></li>')
    head = {"en": f"{n} comments", "de": f"{n} Kommentare", "fr": f"{n} commentaires", "es": f"{n} comentarios",
            "ru": f"Комментарии ({n})", "zh": f"评论（{n}）", "ja": f"コメント（{n}）", "ar": f"التعليقات ({n})"}[site.lang]
    if mark == 0:
        return f'<section id="comments"{site.c("comments")}><h2>{head}</h2><ol>{items}</ol></section>'
    if mark == 3:
        return f'<div id="disqus_thread"><h3>{head}</h3><ul>{items}</ul></div>'
    wid = ' id="comments"' if site.style == "hashed" else ""
    return f'<div{site.c("comments")}{wid}><h3>{head}</h3><ul>{items}</ul></div>'


def t_blog(site, g):
    ttl = title(site.lang)
    g.add(ttl)
    body = paragraphs(site, g, rng.randint(3, 5))
    if rng.random() < 0.5:
        items = [sentence(site.lang)[:60] for _ in range(rng.randint(3, 5))]
        g.add(*items)
        body += "<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>" + paragraphs(site, g, 1)
    cs = comments_section(site, g, rng.randint(3, 8))
    main = (f'<div{site.c("main")}><article class="post"><h1>{esc(ttl)}</h1>{byline(site)}<div{site.c("article")}>{body}</div>'
            f'{share(site)}</article>{cs}</div>')
    return ttl, main + sidebar_html(site)


def user_card(site, verb):
    who = pick(PEOPLE)
    return (f'<div{site.c("usercard")}><span>{verb} {rng.randint(1, 28)} Mar 2021 at {rng.randint(10, 23)}:0{rng.randint(0, 9)}</span>'
            f'<a href="/users/{rng.randint(100, 99999)}">{who}</a><span>{rng.randint(1, 99)},{rng.randint(100, 999)} reputation</span>'
            f'<span>{rng.randint(1, 40)} gold badges</span></div>')


def t_forum(site, g):
    ttl = title(site.lang).rstrip(".") + "?"
    g.add(ttl)
    if rng.random() < 0.5:  # Q&A
        q = par(site.lang, 2, 3)
        g.add(q)
        code = "$ ls -la /var/cache\nls: cannot open directory '/var/cache/app': Permission denied"
        g.add(code)

        def post_comments():
            cm = ""
            for _ in range(rng.randint(0, 3)):
                t = user(site.lang, 1, 1)
                g.comment(t)
                cm += f'<li{site.c("comment")}><span>{esc(t)}</span> &ndash; <a href="/u/{rng.randint(1, 999)}">{pick(PEOPLE)}</a> <span>Mar {rng.randint(1, 28)}</span></li>'
            return (f'<div{site.c("comments")} id="comments-{rng.randint(1000, 99999)}"><ul>{cm}</ul><a href="#">Add a comment</a></div>'
                    if cm else "")
        votes = f'<div{site.c("votes")}><button>Up vote</button><span>{rng.randint(-2, 300)}</span><button>Down vote</button></div>'
        question = (f'<div{site.c("question")} id="question">{votes}<div{site.c("postbody")}><p>{esc(q)}</p><pre><code>{esc(code)}</code></pre></div>'
                    f'<div{site.c("tags")}><a href="/t/linux">linux</a><a href="/t/permissions">permissions</a></div>'
                    f'<div><a href="#">Share</a><a href="#">Improve this question</a><a href="#">Follow</a></div>{user_card(site, "asked")}{post_comments()}</div>')
        n = rng.randint(2, 4)
        answers = f"<h2>{n} Answers</h2>" if site.lang == "en" else f"<h2>{n}</h2>"
        for _ in range(n):
            a = paragraphs(site, g, rng.randint(1, 3))
            answers += (f'<div{site.c("answer")} id="answer-{rng.randint(1000, 99999)}" itemprop="suggestedAnswer" itemscope itemtype="https://schema.org/Answer">{votes}'
                        f'<div{site.c("postbody")} itemprop="text">{a}</div><div><a href="#">Share</a><a href="#">Follow</a></div>{user_card(site, "answered")}{post_comments()}</div>')
        main = f'<div{site.c("main")} itemscope itemtype="https://schema.org/QAPage"><h1>{esc(ttl)}</h1>{question}<div id="answers">{answers}</div></div>'
        return ttl, main + sidebar_html(site)
    # threaded forum: every post's text is main text; user info and signatures are not
    posts = ""
    for k in range(rng.randint(3, 6)):
        who = pick(PEOPLE)
        t = user(site.lang, 1, 4) if k else par(site.lang, 2, 4)
        g.add(t)
        sig = pick(["Sent from my phone", "-- There is no place like 127.0.0.1",
                    "Running Debian stable on a ThinkPad X220 since 2012, and never looked back.",
                    "Please read the forum rules before posting. Thank you!"])
        info = (f'<td{site.c("postauthor")}><b><a href="/member/{rng.randint(1, 9999)}">{who}</a></b><br>{pick(["Member", "Senior Member", "Moderator", "Newbie"])}'
                f'<br>Joined: {pick(["Mar", "Jun", "Oct"])} 20{rng.randint(10, 23)}<br>Posts: {rng.randint(1, 9999)}</td>')
        body = (f'<td{site.c("postbody")}><div>#{k + 1} {rng.randint(1, 28)}.05.2024, {rng.randint(10, 23)}:{rng.randint(10, 59)}</div>'
                f'<div{site.c("posttext")}>{esc(t)}</div><div{site.c("signature")}>{esc(sig)}</div></td>')
        posts += f"<table{site.c('post')}><tr>{info}{body}</tr></table>"
    pager = '<div class="pagination"><a href="?p=1">1</a> <a href="?p=2">2</a> <a href="?p=2">Next</a></div>'
    main = f'<div{site.c("main")}><h1>{esc(ttl)}</h1>{pager}{posts}{pager}</div>'
    return ttl, main


def t_docs(site, g):
    ttl = title(site.lang)
    g.add(ttl)
    body = paragraphs(site, g, 2)
    code = pick(["$ ./configure --prefix=/usr/local\n$ make -j4\n$ sudo make install",
                 "pip install --user quillsync\nquillsync init ~/notes\nquillsync push",
                 "[server]\nport = 8080\nworkers = 4\n\n[cache]\npath = /var/cache/app"])
    g.add(code)
    body += f"<pre>{esc(code)}</pre>"
    h = "Options" if site.lang == "en" else sentence(site.lang)[:30]
    g.add(h)
    rows = [("--verbose", "Print each file as it is handled"), ("--jobs N", "Number of workers"),
            ("--dry-run", "Show the plan only"), ("--timeout S", "Seconds before a remote gives up")]
    body += f"<h2>{esc(h)}</h2><table><tr><th>Option</th><th>Meaning</th></tr>"
    g.add("Option", "Meaning")
    for o, m in rows[:rng.randint(2, 4)]:
        m = m if site.lang == "en" else sentence(site.lang)[:50]
        g.add(o, m)
        body += f"<tr><td><code>{o}</code></td><td>{esc(m)}</td></tr>"
    body += "</table>" + paragraphs(site, g, rng.randint(1, 2))
    toc = "".join(f'<li><a href="/docs/{w}">{w.capitalize()}</a></li>' for w in ["install", "usage", "config", "faq", "api"])
    main = (f'<div{site.c("sidebar")}><ul>{toc}</ul></div><div{site.c("main")} role="main"><div class="breadcrumbs"><a href="/">Docs</a> &raquo; {esc(ttl)}</div>'
            f'<div{site.c("article")}><h1>{esc(ttl)}</h1>{body}</div><div class="footer-nav"><a href="/prev">&laquo; Previous</a> <a href="/next">Next &raquo;</a></div></div>')
    return ttl, main


NAMES = half(["Anna Berg", "Jonas Falk", "Mei Lin", "Carlos Vidal", "Sofia Rossi", "Ahmed Karim", "Yuki Tanaka",
              "Olga Ivanova", "Peter Novak", "Grace Kim", "Lars Eriksen", "Amara Diallo", "Tom Becker",
              "Eva Horvat", "Ravi Shah", "Lena Vogel", "Marco Conti", "Ines Duarte"])


def names_list(g, n):
    names = rng.sample(NAMES, n)
    g.add(*names)
    tag = pick(["ul", "ol"])
    return f"<{tag}>" + "".join(f"<li>{x}</li>" for x in names) + f"</{tag}>"


def t_wiki(site, g):
    ttl = title(site.lang)
    g.add(ttl)
    edit = '<span class="mw-editsection">[<a href="?action=edit">edit</a>]</span>'
    body = paragraphs(site, g, 2)
    for _ in range(rng.randint(1, 2)):
        h = sentence(site.lang)[:35]
        g.add(h)
        body += f"<h2><span class=\"mw-headline\">{esc(h)}</span>{edit}</h2>" + paragraphs(site, g, rng.randint(1, 2))
    h = {"en": "Contributors", "de": "Mitwirkende", "fr": "Contributeurs", "es": "Colaboradores", "ru": "Участники",
         "zh": "贡献者", "ja": "協力者", "ar": "المساهمون"}[site.lang]
    g.add(h)
    body += f"<h2><span class=\"mw-headline\">{h}</span>{edit}</h2>" + names_list(g, rng.randint(5, 9))
    cats = " | ".join(f'<a href="/Category:{w}">{w}</a>' for w in ["Buildings", "History", "Local"])
    main = (f'<div id="mw-panel"><ul><li><a href="/Main_Page">Main page</a></li><li><a href="/Random">Random article</a></li></ul></div>'
            f'<div id="content" class="mw-body" role="main"><h1 id="firstHeading">{esc(ttl)}</h1><div id="siteSub">From the wiki</div>'
            f'<div id="bodyContent"><div class="mw-parser-output">{body}</div><div id="catlinks">Categories: {cats}</div></div></div>')
    return ttl, main


def t_product(site, g):
    ttl = pick(["Stoneware teapot", "Walnut desk lamp", "Folding camp chair", "Cast-iron skillet", "Wool blanket",
                "Bamboo cutting board", "Enamel mug set", "Canvas backpack"]) + f" {pick(['Classic', 'Pro', 'Mini', 'XL'])}"
    g.add(ttl)
    desc = paragraphs(site, g, 2)
    feats = [sentence(site.lang)[:55] for _ in range(rng.randint(3, 5))]
    g.add(*feats)
    desc += "<ul>" + "".join(f"<li>{esc(f)}</li>" for f in feats) + "</ul>"
    specs = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in
                    [("Weight", f"{rng.randint(1, 9)}.{rng.randint(0, 9)} kg"), ("Dimensions", f"{rng.randint(10, 60)} x {rng.randint(10, 60)} cm"),
                     ("Material", pick(["Stoneware", "Walnut", "Steel", "Wool"])), ("Item number", str(rng.randint(100000, 999999)))])
    reviews = ""
    rmark = rng.randint(0, 1)
    for _ in range(rng.randint(3, 6)):
        t = user(site.lang, 1, 3)
        rt = pick(["Great value", "Does the job", "Not as pictured", "Love it", "Okay for the price"])
        g.comment(rt, t)
        extra = ' itemprop="review" itemscope itemtype="https://schema.org/Review"' if rmark else ""
        reviews += (f'<div{site.c("review")}{extra}><div>{"&#9733;" * rng.randint(1, 5)} <b>{rt}</b></div><div>{pick(PEOPLE)} &middot; Reviewed on {rng.randint(1, 28)} April 2024</div>'
                    f'<div>Verified Purchase</div><p>{esc(t)}</p><div>{rng.randint(2, 40)} people found this helpful</div><button>Helpful</button><a href="#">Report</a></div>')
    also = "".join(f'<li><a href="/p/{rng.randint(1, 999)}">{pick(["Linen napkins", "Tea strainer", "Oak tray", "Candle set"])}</a><span>&euro;{rng.randint(5, 90)}.99</span></li>' for _ in range(5))
    rh = "Customer reviews" if site.lang == "en" else "Reviews"
    main = (f'<div{site.c("main")} itemscope itemtype="https://schema.org/Product"><div class="breadcrumbs"><a href="/">Shop</a> / <a href="/kitchen">Kitchen</a></div>'
            f'<h1 itemprop="name">{esc(ttl)}</h1><div class="price">&euro;{rng.randint(10, 200)}.99</div><button>Add to cart</button>'
            f'<div itemprop="description"{site.c("article")}>{desc}</div><h2>Specifications</h2><table{site.c("specs")}>{specs}</table>'
            f'<div{site.c("reviews")} id="reviews"><h2>{rh}</h2>{reviews}</div><div{site.c("related")}><h2>Customers also bought</h2><ul>{also}</ul></div></div>')
    return ttl, main


def t_mailing(site, g):
    subj = f"[{pick(['devel', 'announce', 'users'])}] " + title(site.lang)
    g.add(subj)
    who = pick(PEOPLE)
    lines = [par(site.lang, 1, 2), ""]
    if rng.random() < 0.6:
        lines += [("Changes since the last release:" if site.lang == "en" else sentence(site.lang)[:40]), ""]
        for n in rng.sample(NAMES, rng.randint(5, 9)):
            lines.append(f"  * {n}")
        lines.append("")
    lines += ["> " + sentence(site.lang), "> " + sentence(site.lang), "", par(site.lang, 1, 3), "", "Regards,", who]
    msg = "\n".join(lines)
    g.add(msg)
    nav = (f'<ul><li>Previous message: <a href="{rng.randint(1, 999)}.html">{esc(title(site.lang))}</a></li>'
           f'<li>Next message: <a href="{rng.randint(1, 999)}.html">{esc(title(site.lang))}</a></li>'
           f'<li><b>Messages sorted by:</b> <a href="date.html">[ date ]</a> <a href="thread.html">[ thread ]</a> <a href="subject.html">[ subject ]</a></li></ul>')
    if rng.random() < 0.5:
        body = f"<pre>{esc(msg)}</pre>"
    else:
        body = "<div class=\"email-body\">" + "<br>\n".join(esc(l) for l in lines) + "</div>"
    main = (f'<h1>{esc(subj)}</h1><b>{who}</b> <a href="mailto:list@{site.host}">{who.split()[0].lower()} at {site.host}</a><br>'
            f'<i>Tue May {rng.randint(1, 28)} 10:{rng.randint(10, 59)}:00 UTC 2024</i><p>{nav}<hr>{body}<hr><p>{nav}<hr>'
            f'<a href="http://{site.host}/mailman/listinfo">More information about the mailing list</a><br>')
    return subj, main


def t_listing(site, g):
    ttl = pick(["Latest news", "Local politics", "Culture", "All stories", "Archive: May 2024"]) if site.lang == "en" else title(site.lang)
    intro = ""
    if rng.random() < 0.75:
        t = par(site.lang, 1, 2)
        intro = f"<p class=\"{pick(['intro', 'lede', 'section-description', 'desc'])}\">{esc(t)}</p>"
        g.add(ttl, t)
    items = ""
    h = pick(["h2", "h3"])
    for _ in range(rng.randint(8, 16)):
        head = title(site.lang)
        teaser = sentence(site.lang)
        w = pick(["article", "div", "li"])
        items += (f'<{w}{site.c("card")}><{h}><a href="/story/{rng.randint(1, 99999)}">{esc(head)}</a></{h}>'
                  f'<p>{esc(teaser)}</p><span>{rng.randint(1, 28)} May 2024</span></{w}>')
    pager = '<div class="pager"><a href="?page=2">Older stories</a></div>'
    main = f'<div{site.c("main")}><h1>{esc(ttl)}</h1>{intro}<div{site.c("list")}>{items}</div>{pager}</div>'
    return ttl, main + sidebar_html(site)


def t_table(site, g):
    ttl = title(site.lang)
    g.add(ttl)
    body = paragraphs(site, g, rng.randint(3, 5))
    nav = "<br>".join(f'<a href="/{n.lower()}.html"><font size="2">{n}</font></a>' for n in site.nav)
    main = (f'<table width="100%" border="0" cellpadding="4"><tr><td width="160" valign="top" bgcolor="#eeeeee">{nav}</td>'
            f'<td valign="top"><font face="Verdana"><h2>{esc(ttl)}</h2>{body}</font></td></tr>'
            f'<tr><td colspan="2"><font size="1">Last updated 12.03.2003 &middot; <a href="/">Home</a></font></td></tr></table>')
    return ttl, main


def t_deflist(site, g):
    ttl = {"en": "Glossary", "de": "Glossar", "fr": "Glossaire", "es": "Glosario", "ru": "Словарь", "zh": "术语表",
           "ja": "用語集", "ar": "مسرد المصطلحات"}[site.lang]
    g.add(ttl)
    body = paragraphs(site, g, 1)
    body += "<dl>"
    for _ in range(rng.randint(5, 9)):
        term = pick(THINGS).capitalize() if site.lang == "en" else sentence(site.lang)[:12]
        d = par(site.lang, 1, 2)
        g.add(term, d)
        body += f"<dt>{esc(term)}</dt><dd>{esc(d)}</dd>"
    body += "</dl>"
    main = f'<div{site.c("main")}><h1>{esc(ttl)}</h1><div{site.c("article")}>{body}</div></div>'
    return ttl, main + sidebar_html(site)


def t_quotes(site, g):
    ttl = title(site.lang)
    g.add(ttl)
    body = paragraphs(site, g, 1)
    for _ in range(rng.randint(1, 3)):
        q = ""
        for _ in range(rng.randint(2, 4)):
            t = par(site.lang, 2, 3)
            g.add(t)
            q += f"<p>{esc(t)}</p>"
        cite = pick(PEOPLE)
        g.add(cite)
        body += f"<blockquote>{q}<footer><cite>{cite}</cite></footer></blockquote>" + paragraphs(site, g, 1)
    main = f'<div{site.c("main")}><article><h1>{esc(ttl)}</h1>{byline(site)}{body}</article></div>'
    return ttl, main + sidebar_html(site)


MAN_OPTS = half([("-a, --all", "do not ignore entries starting with ."), ("-l", "use a long listing format"),
                 ("-h, --human-readable", "with -l, print sizes like 1K 234M 2G"), ("-r, --reverse", "reverse order while sorting"),
                 ("-R, --recursive", "list subdirectories recursively"), ("-t", "sort by time, newest first"),
                 ("-S", "sort by file size, largest first"), ("-1", "list one file per line"),
                 ("-d, --directory", "list directories themselves, not their contents"), ("-i, --inode", "print the index number of each file")])


def t_manpage(site, g):
    cmd = pick(["ls", "lsx", "dirlist", "showfiles"])
    ttl = f"{cmd.upper()}(1)"
    lines = [f"{cmd.upper()}(1)                     User Commands                    {cmd.upper()}(1)", "", "NAME",
             f"       {cmd} - " + ("list directory contents" if site.lang == "en" else sentence(site.lang)[:40]), "",
             "SYNOPSIS", f"       {cmd} [OPTION]... [FILE]...", "", "DESCRIPTION"]
    lines += ["       " + par(site.lang, 2, 3), ""]
    for o, d in MAN_OPTS:
        lines += [f"       {o}", "              " + (d if site.lang == "en" else sentence(site.lang)), ""]
    lines += ["AUTHOR", f"       Written by {pick(PEOPLE)}.", "", "SEE ALSO", "       dir(1), vdir(1)", "",
              f"GNU coreutils 9.1                 April 2024                        {cmd.upper()}(1)"]
    text = "\n".join(lines)
    g.add(text)
    foot = (f'<hr><p>This page was generated by man2html from the {cmd} manual page, part of the manual pages collection. '
            f'Other pages: <a href="dir.html">dir(1)</a> <a href="vdir.html">vdir(1)</a>.</p>')
    main = f'<h1>Man page of {cmd.upper()}</h1><pre>{esc(text)}</pre>{foot}'
    g.add(f"Man page of {cmd.upper()}")
    return ttl, main


def t_divsoup(site, g):
    site.style = "hashed"
    ttl = title(site.lang)
    g.add(ttl)
    body = ""
    for _ in range(rng.randint(3, 6)):
        t = par(site.lang)
        g.add(t)
        body += f"<div{site.c('para')}>{esc(t)}</div>"
    rel = "".join(f'<div{site.c("relitem")}><a href="/s/{rng.randint(1, 999)}">{esc(title(site.lang))}</a></div>' for _ in range(5))
    main = (f'<div{site.c("page")}><div{site.c("col")}><div{site.c("h")}>{esc(ttl)}</div>'
            f'<div{site.c("meta")}><a href="/a/1">{pick(PEOPLE)}</a> <span>5 min read</span></div><div{site.c("txt")}>{body}</div></div>'
            f'<div{site.c("rail")}>{rel}</div></div>')
    return ttl, main


def t_heavy(site, g):
    ttl = title(site.lang)
    g.add(ttl)
    body = paragraphs(site, g, rng.randint(1, 2), 2, 3)
    bl = site.boiler
    news = f'<div{site.c("newsletter")}><h3>Newsletter</h3><p>{esc(bl["newsletter"])}</p><form><input type="email"><button>Sign up</button></form></div>'
    about = f'<div{site.c("about")}><h3>About us</h3><p>{esc(bl["about"])}</p></div>'
    donate = f'<div{site.c("donate")}><p>{esc(bl["donate"])}</p><a href="/support">Support us</a></div>'
    nos = f'<noscript><p>{esc(bl["noscript"])}</p></noscript>'
    order = [donate, news] if S == 0 else [news, donate]
    main = (f'{nos}<div{site.c("main")}><article><h1>{esc(ttl)}</h1>{byline(site)}<div{site.c("article")}>{body}</div>'
            f'{order[0]}</article>{order[1]}</div>{about}')
    return ttl, main


TEMPLATES = [("news", t_news), ("blog", t_blog), ("forum", t_forum), ("docs", t_docs), ("wiki", t_wiki),
             ("product", t_product), ("mailing", t_mailing), ("listing", t_listing), ("table", t_table),
             ("deflist", t_deflist), ("quotes", t_quotes), ("manpage", t_manpage), ("divsoup", t_divsoup),
             ("heavy", t_heavy)]

# --- WARC -------------------------------------------------------------------------------------
rid = RecordIds(f"00000000-0000-4000-a{S}00-")


def encodable(s, enc):
    try:
        s.encode(enc)
        return True
    except UnicodeEncodeError:
        return False


def main():
    os.makedirs(OUT, exist_ok=True)
    members = [gz_member(warc_record([("WARC-Type", "warcinfo"), ("WARC-Date", "2024-05-05T08:00:00Z"),
                                      ("WARC-Record-ID", rid()), ("Content-Type", "application/warc-fields")],
                                     f"software: make-extract-web.py {SET}\r\n".encode()))]
    truth = []
    li = S * 3
    for ti, (name, fn) in enumerate(TEMPLATES):
        langs = ["en"] * 12
        for k in range(4):
            langs.append(LANGS[li % len(LANGS)])
            li += 1
        sites = {}
        for k, lang in enumerate(langs):
            key = (lang == "en", k % 2)
            if key not in sites:
                host = f"{name}{k % 2}{'' if lang == 'en' else '-intl'}.{pick(['example.com', 'example.org', 'example.net'])}"
                sites[key] = Site(host, lang, "hashed" if (k % 2 == 1 and name != "table") else "semantic")
            site = sites[key]
            site.lang = lang
            g = Gold()
            ttl, body = fn(site, g)
            html = page(site, ttl, body, lang_attr=rng.random() < 0.8)
            enc = "utf-8"
            if rng.random() < 0.3 or (lang in ("ru", "zh", "ja") and rng.random() < 0.5):
                enc = pick(CHARSETS[lang])
            text_all = html
            if not encodable(text_all, enc):
                enc = "utf-8"
            decl = rng.randint(0, 3)  # 0: HTTP and meta, 1: HTTP, 2: meta, 3: neither
            if enc == "utf-8" and decl == 3:
                decl = 2
            meta = enc if decl in (0, 2) else ""
            html = html.replace('<meta charset="{CHARSET}">', f'<meta charset="{meta}">' if meta else "")
            ctype = "text/html" + (f"; charset={enc}" if decl in (0, 1) else "")
            body_bytes = html.encode(enc)
            r = rid()
            path = f"/{name}/{len(truth)}"
            url = f"https://{site.host}{path}"
            http = f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\n"
            if lang != "en" and rng.random() < 0.5:
                http += f"Content-Language: {lang}\r\n"
            http += f"Content-Length: {len(body_bytes)}\r\n\r\n"
            rec = warc_record([("WARC-Type", "response"), ("WARC-Date", "2024-05-05T08:00:00Z"), ("WARC-Record-ID", r),
                               ("WARC-Target-URI", url), ("Content-Type", "application/http; msgtype=response")],
                              http.encode() + body_bytes)
            members.append(gz_member(rec))
            truth.append({"warc_record_id": r, "url": url, "template": name, "language": lang, "charset": enc,
                          "charset_declared": ["http+meta", "http", "meta", "none"][decl],
                          "cookie_language": site.cookie_lang, "title": ttl, "text": "\n".join(g.lines),
                          "text_with_comments": "\n".join(g.comments)})
    # Interleave the sites as a crawl does (a fixed shuffle).
    order = list(range(1, len(members)))
    random.Random(77 + S).shuffle(order)
    with open(os.path.join(OUT, f"web-{SET}.warc.gz"), "wb") as f:
        f.write(members[0] + b"".join(members[i] for i in order))
    with open(os.path.join(OUT, f"web-{SET}_truth.jsonl"), "w") as f:
        for t in truth:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
