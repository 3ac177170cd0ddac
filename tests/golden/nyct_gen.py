import random, duckdb, numpy as np
random.seed(7)
rows=[]
def ts(d,h,m): return f"2016-01-{d:02d} {h:02d}:{m:02d}:00"
for i in range(40):
    d=random.randint(1,9); h=random.randint(0,23); m=random.randint(0,59)
    rows.append([random.choice(["1","2"]), ts(d,h,m), ts(d,h,min(m+7,59)), random.choice([1,1,1,2,3,4,5,6]),
      round(random.uniform(0.3,12),2), -73.98, 40.75, random.choice([1,1,1,2,5]), -73.95, 40.76,
      random.choice([1,1,2,2,3,4]), round(random.uniform(2.5,40),2), random.choice([0,0.5,1]), 0.5,
      round(random.uniform(0,8),2), random.choice([0,0,5.54]), 0.3, 0])
rows.append(["2","2016-02-01 03:00:00","2016-02-01 03:10:00",1,1.1,-73.98,40.75,1,-73.95,40.76,1,6.5,0,0.5,1,0,0.3,0])
rows.append(["1","2017-11-30 23:00:00","2017-11-30 23:20:00",2,3.3,-73.98,40.75,1,-73.95,40.76,2,12.5,0,0.5,0,0,0.3,0])
rows.append(["2","2016-01-31 13:00:00","2016-01-31 13:05:00",1,0.4,-73.98,40.75,1,-73.95,40.76,3,-4.5,0,-0.5,0,0,-0.3,0])
for r in rows:
    r[17]=round(r[11]+r[12]+r[13]+r[14]+r[15]+r[16],2)
def fmt(v):
    if isinstance(v,float): return str(v)
    return str(v)
csv="\n".join(",".join(fmt(v) for v in r) for r in rows)
open("data.csv","w").write(csv+"\n")
con=duckdb.connect()
con.execute("create table nyct_lite(vendor_id VARCHAR, pickup_datetime TIMESTAMP, dropoff_datetime TIMESTAMP, passenger_count TINYINT, trip_distance FLOAT, pickup_longitude FLOAT, pickup_latitude FLOAT, rate_code TINYINT, dropoff_longitude FLOAT, dropoff_latitude FLOAT, payment_type TINYINT, fare_amount FLOAT, extra FLOAT, mta_tax FLOAT, tip_amount FLOAT, tolls_amount FLOAT, improvement_surcharge FLOAT, total_amount FLOAT)")
con.execute("insert into nyct_lite select * from read_csv('data.csv', header=false, columns={'a':'VARCHAR','b':'TIMESTAMP','c':'TIMESTAMP','d':'TINYINT','e':'FLOAT','f':'FLOAT','g':'FLOAT','h':'TINYINT','i':'FLOAT','j':'FLOAT','k':'TINYINT','l':'FLOAT','m':'FLOAT','n':'FLOAT','o':'FLOAT','p':'FLOAT','q':'FLOAT','r':'FLOAT'})")
Q=[("select count(passenger_count) from nyct_lite",None,0),
("select sum(passenger_count) from nyct_lite",None,0),
("select sum(total_amount) from nyct_lite",None,0),
("select payment_type,avg(passenger_count) from nyct_lite group by payment_type",None,1),
("select vendor_id,payment_type,rate_code,sum(passenger_count) from nyct_lite where passenger_count>3 group by vendor_id,payment_type,rate_code",None,1),
("select vendor_id,payment_type,rate_code,count(passenger_count),sum(trip_distance),sum(total_amount),sum(tip_amount) from nyct_lite group by vendor_id,payment_type,rate_code",None,1),
("SELECT rate_code, COUNT(vendor_id) num_trips FROM nyct_lite WHERE pickup_datetime < dt'2016-02-01 00:00:00' GROUP BY rate_code ORDER BY rate_code","SELECT rate_code, COUNT(vendor_id) num_trips FROM nyct_lite WHERE pickup_datetime < TIMESTAMP '2016-02-01 00:00:00' GROUP BY rate_code ORDER BY rate_code",0),
("SELECT date(pickup_datetime), avg(fare_amount) FROM nyct_lite where parts 2016010100..2016010800 WHERE passenger_count = 1 GROUP BY date(pickup_datetime)","SELECT cast(pickup_datetime as date), avg(fare_amount) FROM nyct_lite where pickup_datetime >= TIMESTAMP '2016-01-01' and pickup_datetime < TIMESTAMP '2016-01-08' and passenger_count = 1 GROUP BY 1",1),
("select count(total_amount) from nyct_lite where parts 2016013112 where total_amount<0","select count(total_amount) from nyct_lite where pickup_datetime >= TIMESTAMP '2016-01-31 12:00:00' and pickup_datetime < TIMESTAMP '2016-02-01 00:00:00' and total_amount<0",0),
]
def cell(v):
    if v is None: return ""
    if isinstance(v,float): return repr(v)
    return str(v)
out=["# The eight OIDBS nyct_lite queries and the alert query, exactly as JoinBase writes them,",
"# on a small data set; the expected answers were computed by DuckDB 2.0 from the same CSV",
"# (Float32 columns as FLOAT, sums in DOUBLE). Some rows are flushed, some still buffered.","",
"statement ok","CREATE TABLE benchmark.nyct_lite(vendor_id String, pickup_datetime DateTime, dropoff_datetime DateTime, passenger_count Int8, trip_distance Float32, pickup_longitude Float32, pickup_latitude Float32, rate_code Int8, dropoff_longitude Float32, dropoff_latitude Float32, payment_type Int8, fare_amount Float32, extra Float32, mta_tax Float32, tip_amount Float32, tolls_amount Float32, improvement_surcharge Float32, total_amount Float32) PARTITION BY ymdh12(pickup_datetime)",""]
lines=csv.split("\n")
out+=["write benchmark.nyct_lite"]+lines[:25]+["","statement ok","FLUSH TABLE benchmark.nyct_lite","","write benchmark.nyct_lite"]+lines[25:]+[""]
for q,dq,sort in Q:
    res=con.execute(dq or q).fetchall()
    out+=["query rowsort" if sort else "query", q, "----"]+[",".join(cell(v) for v in r) for r in res]+[""]
open("nyct.slt","w").write("\n".join(out))
