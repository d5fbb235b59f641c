-- wrk script of bench/run_http.sh for the token benchmark: each request carries the next bearer
-- token of a file (one per line), cycling through them; without a file, no Authorization at all.
--   wrk ... -s bench/http/tokens.lua URL -- TOKENS_FILE
local tokens, n, i = {}, 0, 0

function init(args)
  if args[1] then
    for line in io.lines(args[1]) do
      n = n + 1
      tokens[n] = line
    end
  end
end

function request()
  if n == 0 then
    return wrk.format()
  end
  i = i % n + 1
  return wrk.format(nil, nil, { ["Authorization"] = "Bearer " .. tokens[i] })
end
