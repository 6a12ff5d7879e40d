package docwalk

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// command is one shell command of a document, as written.
type command struct {
	file   string // repository-relative path
	line   int    // 1-based line of its first line
	text   string // its lines, continuations kept
	bg     bool   // ends in & (or is followed by another command on its line after &)
	output string // what the document shows it prints: the lines after its `$ ` prompt, or an unmarked block right after its block
	expect []*regexp.Regexp
	skip   string // a docwalk: skip comment's reason
	inline bool   // an inline code span of the prose
}

func (c command) String() string { return fmt.Sprintf("%s:%d: %s", c.file, c.line, c.text) }

var (
	fenceRE      = regexp.MustCompile("^\\s*```\\s*([A-Za-z0-9_+-]*)")
	annotationRE = regexp.MustCompile(`^\s*<!--\s*docwalk:\s*(skip|expect)\s+(.*?)\s*-->\s*$`)
)

// shellLangs are the fence languages whose blocks are commands.
var shellLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}

type docLine struct {
	n    int
	text string
}

// extract returns the commands of the Markdown file at path, named file.
func extract(path, file string) ([]command, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		cmds     []command
		in       bool
		lang     string
		block    []docLine
		para     []docLine // the prose paragraph so far
		skip     string
		expects  []*regexp.Regexp
		n        int
		sc       = bufio.NewScanner(f)
		fenceAt  int
		annotErr error
		shownFor = -1 // the command an unmarked output block right after its block shows
	)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		if !in {
			if m := annotationRE.FindStringSubmatch(line); m != nil {
				switch m[1] {
				case "skip":
					skip = m[2]
				case "expect":
					s := strings.Trim(m[2], `"`)
					re, err := regexp.Compile(s)
					if err != nil {
						annotErr = fmt.Errorf("%s:%d: docwalk expect: %w", file, n, err)
					}
					expects = append(expects, re)
				}
				continue
			}
			if m := fenceRE.FindStringSubmatch(line); m != nil {
				cmds = append(cmds, inlineCommands(file, para)...)
				para = nil
				in, lang, block, fenceAt = true, m[1], nil, n
			} else if strings.TrimSpace(line) != "" {
				skip, expects, shownFor = "", nil, -1
				para = append(para, docLine{n, line})
			} else {
				cmds = append(cmds, inlineCommands(file, para)...)
				para = nil
			}
			continue
		}
		if fenceRE.MatchString(line) && strings.TrimSpace(strings.TrimLeft(line, " `")) == "" {
			in = false
			cs, err := blockCommands(file, lang, block)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", file, fenceAt, err)
			}
			for i := range cs {
				cs[i].skip, cs[i].expect = skip, expects
			}
			switch {
			case len(cs) > 0:
				cmds = append(cmds, cs...)
				shownFor = len(cmds) - 1
			case lang == "" && shownFor >= 0:
				for _, l := range block {
					cmds[shownFor].output += l.text + "\n"
				}
				shownFor = -1
			default:
				shownFor = -1
			}
			skip, expects = "", nil
			continue
		}
		block = append(block, docLine{n, line})
	}
	cmds = append(cmds, inlineCommands(file, para)...)
	if annotErr != nil {
		return nil, annotErr
	}
	if in {
		return nil, fmt.Errorf("%s:%d: fence never closed", file, fenceAt)
	}
	return cmds, sc.Err()
}

// blockCommands splits a fenced block into commands; a block that is not
// shell gives none.
func blockCommands(file, lang string, block []docLine) ([]command, error) {
	prompted := false
	for _, l := range block {
		if strings.HasPrefix(strings.TrimSpace(l.text), "$ ") {
			prompted = true
			break
		}
	}
	if !shellLangs[lang] {
		if lang != "" {
			return nil, nil
		}
		if !prompted && !allKnownPrograms(block) {
			return nil, nil
		}
	}
	var (
		cmds []command
		cur  []docLine
		st   shellState
	)
	flush := func() {
		if len(cur) == 0 {
			return
		}
		lines := make([]string, len(cur))
		for i, l := range cur {
			lines[i] = l.text
		}
		for _, part := range splitBackground(strings.Join(lines, "\n")) {
			cmds = append(cmds, command{file: file, line: cur[0].n, text: part.text, bg: part.bg})
		}
		cur, st = nil, shellState{}
	}
	for _, l := range block {
		text := l.text
		if len(cur) == 0 {
			t := strings.TrimSpace(text)
			if prompted {
				p, ok := strings.CutPrefix(t, "$ ")
				if !ok {
					if len(cmds) > 0 {
						cmds[len(cmds)-1].output += text + "\n"
					}
					continue
				}
				text = p
			} else {
				if t == "" || strings.HasPrefix(t, "#") {
					continue
				}
				text = t
			}
		}
		cur = append(cur, docLine{l.n, text})
		st.feed(text)
		if st.complete() {
			flush()
		}
	}
	if len(cur) > 0 {
		return nil, fmt.Errorf("line %d: command never ends (open quote, continuation or loop): %q", cur[0].n, cur[0].text)
	}
	return cmds, nil
}

// allKnownPrograms reports whether every line of an unmarked block that
// does not continue the one before it starts with a program of the table.
func allKnownPrograms(block []docLine) bool {
	seen := false
	var st shellState
	for _, l := range block {
		t := strings.TrimSpace(l.text)
		if t == "" && st.complete() {
			continue
		}
		if st.complete() {
			if _, ok := programs[firstWord(t)]; !ok {
				return false
			}
			seen = true
		}
		st.feed(t)
	}
	return seen && st.complete()
}

func firstWord(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// shellState follows quotes, continuations and loop keywords across the
// lines of one command: enough for the documents' shell, not a parser.
type shellState struct {
	single, double, cont bool
	depth                int
}

var openers = map[string]int{"for": 1, "while": 1, "until": 1, "if": 1, "case": 1, "done": -1, "fi": -1, "esac": -1}

func (s *shellState) feed(line string) {
	s.cont = false
	word := strings.Builder{}
	endWord := func() {
		if d, ok := openers[word.String()]; ok {
			s.depth += d
		}
		word.Reset()
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case s.single:
			if c == '\'' {
				s.single = false
			}
			continue
		case s.double:
			if c == '\\' {
				i++
			} else if c == '"' {
				s.double = false
			}
			continue
		}
		switch c {
		case '\'':
			s.single = true
		case '"':
			s.double = true
		case '\\':
			if i == len(line)-1 {
				s.cont = true
			}
			i++
		case '#':
			if word.Len() == 0 {
				endWord()
				return
			}
			word.WriteByte(c)
		case ' ', '\t', ';', '&', '|', '(', ')':
			endWord()
		default:
			word.WriteByte(c)
		}
	}
	endWord()
}

func (s *shellState) complete() bool { return !s.single && !s.double && !s.cont && s.depth <= 0 }

type part struct {
	text string
	bg   bool
}

// splitBackground splits a command at each top-level & (not &&, >&, &>):
// `etcd ... &  nats-server ... &` is two background commands.
func splitBackground(text string) []part {
	var (
		parts          []part
		start          int
		single, double bool
	)
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case single:
			single = c != '\''
			continue
		case double:
			if c == '\\' {
				i++
			} else if c == '"' {
				double = false
			}
			continue
		}
		switch c {
		case '\'':
			single = true
		case '"':
			double = true
		case '\\':
			i++
		case '#':
			if i == 0 || text[i-1] == ' ' || text[i-1] == '\t' {
				for i < len(text) && text[i] != '\n' {
					i++
				}
			}
		case '&':
			if (i+1 < len(text) && text[i+1] == '&') || (i > 0 && (text[i-1] == '&' || text[i-1] == '>')) ||
				(i+1 < len(text) && text[i+1] == '>') {
				continue
			}
			parts = append(parts, part{strings.TrimSpace(text[start:i]), true})
			start = i + 1
		}
	}
	if rest := strings.TrimSpace(stripComment(text[start:])); rest != "" {
		parts = append(parts, part{strings.TrimSpace(text[start:]), false})
	}
	return parts
}

// stripComment drops a trailing shell comment of a one-line text (for the
// emptiness test only).
func stripComment(s string) string {
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "#") {
		return ""
	}
	return t
}

var (
	spanRE        = regexp.MustCompile("`([^`]+)`")
	inlineProgRE  = regexp.MustCompile(`^(?:kvgate|bin/kvgate|go run \./cmd/kvgate|curl)\s`)
	placeholderRE = regexp.MustCompile(`…|\.\.\.|<[^>]*>|(^|\s)[A-Z][A-Z0-9_]*(\s|$)`)
)

// inlineCommands are the commands among a prose paragraph's code spans
// (a span may wrap lines; it counts from its first line): a span
// that starts with kvgate (bin/kvgate, go run ./cmd/kvgate) and gives an
// argument after the subcommand, or a curl with an argument, and holds no
// placeholder (…, ..., <x>, an upper-case word like CONFIG or T). The
// rest (`kvgate extproc`, `kvgate replay --config CONFIG`) name things.
func inlineCommands(file string, para []docLine) []command {
	var (
		cmds   []command
		b      strings.Builder
		starts []int // offset of each line in b
	)
	for _, l := range para {
		starts = append(starts, b.Len())
		b.WriteString(l.text + "\n")
	}
	joined := b.String()
	for _, loc := range spanRE.FindAllStringSubmatchIndex(joined, -1) {
		text := strings.Join(strings.Fields(joined[loc[2]:loc[3]]), " ")
		i := sort.SearchInts(starts, loc[0]+1) - 1
		n := para[i].n
		if !inlineProgRE.MatchString(text+" ") || placeholderRE.MatchString(text) {
			continue
		}
		words := strings.Fields(strings.Replace(text, "go run ./cmd/kvgate", "kvgate", 1))
		need := 3 // kvgate SUB ARG
		switch {
		case words[0] == "curl":
			need = 2
		case len(words) > 1 && words[1] == "policy":
			need = 4 // kvgate policy check|replay ARG
		}
		if len(words) < need {
			continue
		}
		cmds = append(cmds, command{file: file, line: n, text: text, inline: true})
	}
	return cmds
}
