/* markdown: a small, safe Markdown-to-HTML renderer for chat replies.

   Safety comes from the order of work: the whole text is HTML-escaped first, so
   every tag in the output is one this file writes, and a link is made only for an
   http(s) or mailto target. Covers fenced code blocks (an unclosed fence, as in a
   reply still streaming, runs to the end), inline code, bold, italic,
   strikethrough, headings, ordered and unordered (nested) lists, block quotes,
   tables, horizontal rules, links, bare URLs and paragraphs. */

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

/** The text with &, <, >, " and ' as HTML entities. */
export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

/** The HTML of a Markdown text. */
export function renderMarkdown(source) {
  // NUL delimits inline placeholders below, so none may come from the text
  const lines = escapeHtml(source.replace(/\0/g, "")).split(/\r\n|\r|\n/);
  return renderBlocks(lines);
}

const FENCE = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^\s{0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^\s{0,3}&gt;\s?/;
const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_DIVIDER = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

// blocks over escaped lines (block quotes and list items recurse on their own lines)
function renderBlocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      i = codeBlock(lines, i, fence, out);
    } else if (!line.trim()) {
      i++;
    } else if (HEADING.test(line)) {
      const [, hashes, text] = line.match(HEADING);
      out.push(`<h${hashes.length}>${inline(text)}</h${hashes.length}>`);
      i++;
    } else if (RULE.test(line)) {
      out.push("<hr>");
      i++;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && QUOTE.test(lines[i])) quoted.push(lines[i++].replace(QUOTE, ""));
      out.push(`<blockquote>${renderBlocks(quoted)}</blockquote>`);
    } else if (LIST_ITEM.test(line)) {
      i = list(lines, i, out);
    } else if (line.includes("|") && TABLE_DIVIDER.test(lines[i + 1] || "")) {
      i = table(lines, i, out);
    } else {
      i = paragraph(lines, i, out);
    }
  }
  return out.join("\n");
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
    LIST_ITEM.test(line);
}

function codeBlock(lines, start, fence, out) {
  const [, marker, language] = fence;
  const closing = new RegExp(`^\\s*${marker[0]}{${marker.length},}\\s*$`);
  const body = [];
  let i = start + 1;
  while (i < lines.length && !closing.test(lines[i])) body.push(lines[i++]);
  const cls = language ? ` class="language-${language}"` : "";
  out.push(`<pre><code${cls}>${body.join("\n")}</code></pre>`);
  return i + 1;  // past the closing fence, or past the end while a reply streams
}

function paragraph(lines, start, out) {
  const text = [lines[start]];
  let i = start + 1;
  while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) text.push(lines[i++]);
  out.push(`<p>${text.map((l) => inline(l.trim())).join("<br>")}</p>`);
  return i;
}

// a list and the lists nested in its items (lines indented more than its markers)
function list(lines, start, out) {
  const first = lines[start].match(LIST_ITEM);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const items = [];  // each {text: [lines], nested: [lines]}
  let i = start;
  while (i < lines.length) {
    const line = lines[i];
    const item = line.match(LIST_ITEM);
    if (item && item[1].length <= indent) {
      if (/\d/.test(item[2]) !== ordered || item[1].length < indent) break;
      items.push({ text: [item[3]], nested: [] });
    } else if (item || (line.trim() && /^\s/.test(line) && items.at(-1).nested.length)) {
      items.at(-1).nested.push(line);
    } else if (line.trim()) {
      if (!/^\s/.test(line) && !lines[i - 1].trim()) break;  // a new paragraph
      items.at(-1).text.push(line.trim());
    } else {
      const next = lines.slice(i + 1).find((l) => l.trim());
      const goesOn = next !== undefined && (/^\s/.test(next) || LIST_ITEM.test(next));
      if (!goesOn) break;
    }
    i++;
  }
  const tag = ordered ? "ol" : "ul";
  const number = parseInt(first[2], 10);
  const startAttr = ordered && number !== 1 ? ` start="${number}"` : "";
  const body = items.map(({ text, nested }) =>
    `<li>${text.map(inline).join("<br>")}${nested.length ? renderBlocks(nested) : ""}</li>`);
  out.push(`<${tag}${startAttr}>${body.join("")}</${tag}>`);
  return i;
}

function table(lines, start, out) {
  const cells = (line) => line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|")
    .map((c) => inline(c.trim()));
  const head = cells(lines[start]).map((c) => `<th>${c}</th>`).join("");
  const rows = [];
  let i = start + 2;
  while (i < lines.length && lines[i].includes("|")) {
    rows.push(`<tr>${cells(lines[i++]).map((c) => `<td>${c}</td>`).join("")}</tr>`);
  }
  out.push(`<table><thead><tr>${head}</tr></thead><tbody>${rows.join("")}</tbody></table>`);
  return i;
}

const SAFE_HREF = /^(https?:\/\/|mailto:)\S+$/i;
// [label](target "title"); the target may hold one level of balanced parentheses
const LINK = /\[([^\]\n]+)\]\(\s*((?:[^\s()]|\([^\s()]*\))+)(?:\s+&quot;.*?&quot;)?\s*\)/g;
// a bare URL ends at a space, a parenthesis or an escaped quote or angle bracket
const BARE_URL = /\bhttps?:\/\/(?:(?!&quot;|&#39;|&lt;|&gt;)[^\s()])+/g;
const TRAILING_PUNCTUATION = /[.,;:!?*_~]+$/;

// inline markup over an escaped line; code spans and links are set aside as
// NUL-delimited placeholders so that no later rule rewrites inside them
function inline(text) {
  const kept = [];
  const keep = (html) => `\0${kept.push(html) - 1}\0`;
  text = text.replace(/(`+)(.+?)\1/g, (_, ticks, code) => keep(`<code>${code}</code>`));
  text = text.replace(LINK, (_, label, href) =>
    keep(SAFE_HREF.test(href) ? anchor(href, emphasis(label)) : emphasis(label)));
  text = text.replace(BARE_URL, (url) => {
    const tail = url.match(TRAILING_PUNCTUATION)?.[0] || "";
    const href = url.slice(0, url.length - tail.length);
    return keep(anchor(href, href)) + tail;
  });
  text = emphasis(text);
  while (text.includes("\0")) text = text.replace(/\0(\d+)\0/g, (_, n) => kept[n]);
  return text;
}

function anchor(href, label) {
  return `<a href="${href}" target="_blank" rel="noopener noreferrer">${label}</a>`;
}

function emphasis(text) {
  return text
    .replace(/\*\*([^\s*](?:.*?[^\s*])?)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|\W)__([^\s_](?:.*?[^\s_])?)__(?!\w)/g, "$1<strong>$2</strong>")
    .replace(/\*([^\s*](?:[^*]*?[^\s*])?)\*/g, "<em>$1</em>")
    .replace(/(^|\W)_([^\s_](?:[^_]*?[^\s_])?)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~([^\s~](?:.*?[^\s~])?)~~/g, "<del>$1</del>");
}
